// The generation routes: /v1/chat/completions, /v1/completions, /v1/messages and
// /v1/messages/count_tokens. A request becomes a prompt (through the chat template, tools
// included), an optional grammar (tool calls, response_format, `grammar`), n jobs on the
// scheduler, and an answer split into reasoning, text and tool calls (OutputParser), written in
// the API's shape (response_writer.h).
#include <httplib.h>

#include <chrono>
#include <random>

#include "core/log.h"
#include "serve/connection.h"
#include "serve/json_schema.h"
#include "serve/output_parser.h"
#include "serve/protocol.h"
#include "serve/response_writer.h"
#include "serve/server.h"

namespace substrate::serve {

namespace {

using Clock = std::chrono::steady_clock;

ApiError Error(int status, std::string type, std::string message, std::string code = "") {
  ApiError e;
  e.http_status = status;
  e.type = std::move(type);
  e.message = std::move(message);
  e.code = std::move(code);
  return e;
}

void Send(httplib::Response& res, Api api, const ApiError& e) {
  res.status = e.http_status;
  // A model that could not be made to write a well-formed answer will not do better on a
  // retry of the same request: tell the SDKs not to retry.
  if (e.code == "tool_call_parse_error") res.set_header("x-should-retry", "false");
  res.set_content(ErrorBody(api, e), "application/json");
}

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Finish ToFinish(JobEnd end) {
  switch (end) {
    case JobEnd::kEndOfText:
      return Finish::kEndOfText;
    case JobEnd::kStopSequence:
      return Finish::kStopSequence;
    default:
      return Finish::kLength;
  }
}

ApiError ToolParseError(const std::string& why) {
  return Error(500, "api_error",
               "the model's answer is not a well-formed tool call (" + why +
                   "); tool_choice requires one (was the answer cut short by max_tokens or a "
                   "stop sequence?)",
               "tool_call_parse_error");
}

// The grammar a request's answer must follow, and its triggers (auto tool calls): empty text
// when the answer is free.
struct GrammarSpec {
  std::string text;
  std::vector<std::string> triggers;
};

Expected<GrammarSpec> GrammarFor(const GenerationRequest& gr, const ChatPrompt* cp) {
  GrammarSpec g;
  const bool tools_on = cp && !gr.tools.empty() && gr.tool_choice != ToolChoice::kNone;
  // With reasoning left open by the prompt, the constrained part follows it.
  std::string prefix;
  if (cp && cp->thinking_open)
    prefix = "( " + GrammarTextWithout(cp->think_close) + " ) " + GrammarLiteral(cp->think_close) +
             " ws";
  if (tools_on &&
      (gr.tool_choice == ToolChoice::kRequired || gr.tool_choice == ToolChoice::kNamed)) {
    std::vector<ToolSpec> subset;
    for (const ToolSpec& t : gr.tools)
      if (gr.tool_choice == ToolChoice::kRequired || t.name == gr.tool_choice_name)
        subset.push_back(t);
    ASSIGN_OR_RETURN(g.text,
                     ToolCallGrammar(cp->tool_format, subset, gr.parallel_tool_calls, prefix));
    return g;
  }
  if (tools_on) {
    if (gr.format != OutputFormat::kText)
      return InvalidArgument(
          "response_format or grammar together with tools under tool_choice \"auto\" is not "
          "supported; use tool_choice \"required\" (tools) or \"none\" (the format)");
    // Free text until the model starts a call; from there the call is constrained. Functionary
    // v3.2 starts text and calls alike (">>>"), so its calls are only parsed.
    if (cp->tool_format == ToolFormat::kFunctionaryV32) return g;
    ASSIGN_OR_RETURN(g.text, ToolCallGrammar(cp->tool_format, gr.tools, gr.parallel_tool_calls));
    g.triggers = ToolCallTriggers(cp->tool_format);
    if (cp->tool_format == ToolFormat::kLlama3) g.triggers.push_back("{\"name\"");
    return g;
  }
  switch (gr.format) {
    case OutputFormat::kText:
      break;
    case OutputFormat::kJsonObject:
      g.text = JsonObjectGrammar(prefix);
      break;
    case OutputFormat::kJsonSchema: {
      ASSIGN_OR_RETURN(g.text, JsonSchemaGrammar(gr.schema, prefix));
      break;
    }
    case OutputFormat::kGrammar:
      g.text = gr.grammar;
      break;  // covers the whole answer
  }
  return g;
}

// A request, ready to run: its prompt, how to read the answer, and the sampling of each job.
struct Prepared {
  std::vector<int32_t> prompt;
  OutputOptions output;
  SamplingParams sampling;
};

}  // namespace

void HttpServer::InstallGenerateRoutes() {
  httplib::Server& http = *http_;

  // Validates a request and renders its prompt; false (with *err) when it cannot run.
  auto prepare = [this](Api api, GenerationRequest& gr, Prepared* p, ApiError* err) {
    ChatPrompt cp;
    if (api == Api::kOpenAICompletion && gr.has_prompt_ids) {
      p->prompt = gr.prompt_ids;
      for (int32_t id : p->prompt)
        if (id >= backend_->VocabSize()) {
          *err = BadRequest("prompt token id " + std::to_string(id) +
                                " is outside the vocabulary (size " +
                                std::to_string(backend_->VocabSize()) + ")",
                            "prompt");
          return false;
        }
    } else if (api == Api::kOpenAICompletion) {
      auto ids = backend_->EncodeText(gr.prompt_text);
      if (!ids.ok()) {
        *err = BadRequest(ids.status().message(), "prompt");
        return false;
      }
      p->prompt = std::move(*ids);
    } else {
      const bool tools_on = !gr.tools.empty() && gr.tool_choice != ToolChoice::kNone;
      auto chat = backend_->EncodeChat(gr.messages, tools_on ? ToolsJson(gr.tools) : nullptr);
      if (!chat.ok()) {
        *err = BadRequest(chat.status().message(), "messages");
        return false;
      }
      cp = std::move(*chat);
      p->prompt = cp.tokens;
      p->output.parse_tools = tools_on;
      p->output.format = cp.tool_format;
      p->output.tools_required = tools_on && (gr.tool_choice == ToolChoice::kRequired ||
                                              gr.tool_choice == ToolChoice::kNamed);
      p->output.split_reasoning = options_.reasoning_format != "none";
      p->output.thinking_open = cp.thinking_open;
      p->output.think_open = cp.think_open;
      p->output.think_close = cp.think_close;
    }
    if (p->prompt.empty()) {
      *err = BadRequest("the prompt is empty", "prompt");
      return false;
    }
    const int n_prompt = static_cast<int>(p->prompt.size());
    if (n_prompt >= context_) {
      *err = BadRequest("the prompt is " + std::to_string(n_prompt) +
                            " tokens; this server's context holds " + std::to_string(context_) +
                            " tokens (prompt and answer together)",
                        api == Api::kOpenAICompletion ? "prompt" : "messages");
      err->code = "context_length_exceeded";
      return false;
    }
    for (const auto& [id, bias] : gr.sampling.logit_bias)
      if (id >= backend_->VocabSize()) {
        *err = BadRequest("logit_bias names token " + std::to_string(id) +
                              ", outside the vocabulary (size " +
                              std::to_string(backend_->VocabSize()) + ")",
                          "logit_bias");
        return false;
      }
    auto spec = GrammarFor(gr, api == Api::kOpenAICompletion ? nullptr : &cp);
    if (!spec.ok()) {
      *err = BadRequest(spec.status().message(), gr.format == OutputFormat::kGrammar ? "grammar"
                                                 : gr.format == OutputFormat::kText
                                                     ? "tools"
                                                     : "response_format");
      return false;
    }
    p->sampling = gr.sampling;
    if (!spec->text.empty()) {
      auto grammar = ParseGrammar(spec->text);
      if (!grammar.ok()) {
        *err = BadRequest(grammar.status().message(),
                          gr.format == OutputFormat::kGrammar ? "grammar" : "response_format");
        return false;
      }
      p->sampling.grammar = std::make_shared<const Grammar>(std::move(*grammar));
      p->sampling.grammar_triggers = std::move(spec->triggers);
    }
    // Clients often ask for more than a small context leaves: answer up to its end.
    const int room = context_ - n_prompt;
    p->sampling.max_tokens = gr.max_tokens_given ? std::min(p->sampling.max_tokens, room) : room;
    return true;
  };

  auto generate = [this, prepare](Api api) {
    return [this, api, prepare](const httplib::Request& req, httplib::Response& res) {
      GenerationRequest gr;
      ApiError err;
      if (!ParseRequest(api, req.body, &gr, &err)) return Send(res, api, err);
      Prepared p;
      if (!prepare(api, gr, &p, &err)) return Send(res, api, err);

      // n answers: n jobs, seeded seed, seed + 1, ... when a seed is given (reproducible on
      // any slot).
      std::vector<std::shared_ptr<Job>> jobs;
      for (int i = 0; i < gr.n; ++i) {
        SamplingParams sp = p.sampling;
        if (sp.has_seed) sp.seed += static_cast<uint64_t>(i);
        auto job = std::make_shared<Job>(p.prompt, sp, gr.stop);
        Status submitted = scheduler_->Submit(job);
        if (!submitted.ok()) {
          for (auto& j : jobs) scheduler_->Cancel(j);
          const bool anthropic = api == Api::kAnthropicMessages;
          return Send(res, api,
                      Error(anthropic ? 529 : 503, anthropic ? "overloaded_error" : "server_error",
                            submitted.message(), "server_overloaded"));
        }
        jobs.push_back(std::move(job));
      }

      CompletionInfo info;
      info.id = NewId(api);
      info.created = UnixNow();
      info.model = backend_->ModelId();
      info.prompt_tokens = static_cast<int>(p.prompt.size());
      auto fill = [jobs](CompletionInfo* i) {
        i->completion_tokens = 0;
        for (size_t k = 0; k < jobs.size(); ++k) {
          const GenerateResult& r = jobs[k]->result();
          if (k == 0) i->cached_tokens = r.cached_tokens;
          i->completion_tokens += r.generated_tokens;
          i->prompt_seconds = std::max(i->prompt_seconds, r.prefill_seconds);
          i->decode_seconds = std::max(i->decode_seconds, r.decode_seconds);
        }
      };
      auto job_error = [api](const Job& job) {
        const Status& st = job.status();
        if (st.code() == StatusCode::kInvalidArgument) return BadRequest(st.message());
        return Error(500, "api_error", st.ToString());
      };
      const bool logprobs = p.sampling.logprobs >= 0;

      if (!gr.stream) {
        std::vector<ChoiceResult> choices;
        for (auto& job : jobs) {
          ChoiceResult c;
          // Waits for the whole answer, watching the connection: a client gone frees the slots
          // (a non-streaming request has no write to fail until the end).
          std::string text;
          bool gone = false;
          while (!job->Take(std::chrono::milliseconds(100), &text, &c.logprobs)) {
            if (!gone && ConnectionServer::ClientGone()) {
              gone = true;
              for (auto& j : jobs) scheduler_->Cancel(j);
            }
          }
          if (gone) return;  // nobody to answer
          if (job->end() == JobEnd::kFailed || job->end() == JobEnd::kCancelled) {
            for (auto& j : jobs) scheduler_->Cancel(j);
            return Send(res, api, job_error(*job));
          }
          OutputParser parser(p.output);
          parser.Push(text);
          parser.Finish();
          if (!parser.error().empty()) {
            for (auto& j : jobs) scheduler_->Cancel(j);
            return Send(res, api, ToolParseError(parser.error()));
          }
          c.reasoning = parser.reasoning();
          c.content = parser.content();
          c.calls = parser.calls();
          c.finish = ToFinish(job->end());
          c.stop_sequence = job->stop_sequence();
          c.has_logprobs = logprobs;
          choices.push_back(std::move(c));
        }
        fill(&info);
        res.set_content(ChoicesBody(api, info, choices), "application/json");
        return;
      }

      res.set_header("Cache-Control", "no-cache");
      res.set_header("X-Accel-Buffering", "no");
      const bool include_usage = gr.include_usage;
      Scheduler* sched = scheduler_.get();
      auto writer = std::make_shared<StreamWriter>(api, info, gr.n);
      const OutputOptions output = p.output;
      res.set_chunked_content_provider(
          "text/event-stream",
          [jobs, api, info, include_usage, logprobs, sched, fill, writer, output, job_error](
              size_t, httplib::DataSink& sink) mutable {
            auto cancel_all = [&] {
              for (auto& j : jobs) sched->Cancel(j);  // the client is gone: free the slots now
            };
            auto write = [&](const std::string& s) {
              if (s.empty() || sink.write(s.data(), s.size())) return true;
              cancel_all();
              return false;
            };
            if (!write(writer->Start())) return false;
            const size_t n = jobs.size();
            std::vector<OutputParser> parsers(n, OutputParser(output));
            std::vector<char> ended(n, 0);
            std::vector<size_t> offsets(n, 0);  // completions' text_offset
            size_t left = n;
            auto last_write = Clock::now();
            const auto wait = std::chrono::milliseconds(n == 1 ? 100 : 20);
            while (left > 0) {
              for (size_t i = 0; i < n; ++i) {
                if (ended[i]) continue;
                std::string text;
                std::vector<StepLogprobs> lps;
                const bool end = jobs[i]->Take(wait, &text, &lps);
                std::vector<OutputEvent> ev = parsers[i].Push(text);
                std::string out;
                if (!ev.empty() || !lps.empty()) {
                  out = writer->Events(static_cast<int>(i), ev, logprobs ? &lps : nullptr,
                                       offsets[i]);
                  for (const StepLogprobs& lp : lps) offsets[i] += lp.chosen.bytes.size();
                }
                if (end) {
                  if (jobs[i]->end() == JobEnd::kFailed || jobs[i]->end() == JobEnd::kCancelled) {
                    write(out);
                    cancel_all();
                    write(StreamError(api, job_error(*jobs[i])));
                    sink.done();
                    return true;
                  }
                  out += writer->Events(static_cast<int>(i), parsers[i].Finish());
                  if (!parsers[i].error().empty()) {
                    write(out);
                    cancel_all();
                    write(StreamError(api, ToolParseError(parsers[i].error())));
                    sink.done();
                    return true;
                  }
                  out += writer->EndChoice(static_cast<int>(i), ToFinish(jobs[i]->end()),
                                           jobs[i]->stop_sequence(), !parsers[i].calls().empty());
                  ended[i] = 1;
                  --left;
                }
                if (!out.empty()) {
                  if (!write(out)) return false;
                  last_write = Clock::now();
                }
              }
              if (left > 0 && Clock::now() - last_write > std::chrono::milliseconds(300)) {
                // While queued or in a long prefill: a ping, so a gone client is noticed.
                if (!write(StreamPing(api))) return false;
                last_write = Clock::now();
              }
            }
            fill(&info);
            if (!write(writer->Done(info, include_usage))) return false;
            sink.done();
            return true;
          },
          [jobs, sched](bool) {
            for (auto& j : jobs) sched->Cancel(j);
          });
    };
  };
  http.Post("/v1/chat/completions", generate(Api::kOpenAIChat));
  http.Post("/v1/completions", generate(Api::kOpenAICompletion));
  http.Post("/v1/messages", generate(Api::kAnthropicMessages));

  // Anthropic's token count: the prompt the request would make, tools included.
  http.Post(
      "/v1/messages/count_tokens", [this](const httplib::Request& req, httplib::Response& res) {
        const Api api = Api::kAnthropicMessages;
        nlohmann::json body = nlohmann::json::parse(req.body, nullptr, false);
        if (body.is_object() && !body.contains("max_tokens")) body["max_tokens"] = 1;
        GenerationRequest gr;
        ApiError err;
        if (!ParseRequest(api, body.is_discarded() ? req.body : body.dump(), &gr, &err))
          return Send(res, api, err);
        const bool tools_on = !gr.tools.empty() && gr.tool_choice != ToolChoice::kNone;
        auto chat = backend_->EncodeChat(gr.messages, tools_on ? ToolsJson(gr.tools) : nullptr);
        if (!chat.ok()) return Send(res, api, BadRequest(chat.status().message(), "messages"));
        res.set_content(nlohmann::json{{"input_tokens", chat->tokens.size()}}.dump(),
                        "application/json");
      });
}

}  // namespace substrate::serve
