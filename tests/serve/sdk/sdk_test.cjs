// The official OpenAI and Anthropic SDKs against `substrate serve` with the bundled tiny model
// (run by run.sh, which starts the servers). A 6.8M-parameter code model knows nothing of tools
// or JSON: every well-formed call and document here is the constrained decoder's doing.
//  - tool_choice required (OpenAI) / any (Anthropic) with a schema: the call parses and its
//    arguments validate; the tool result goes back in a second request (a round trip);
//  - streamed tool-call deltas (OpenAI tool_calls fragments, Anthropic input_json_delta)
//    reassemble into the same call as the non-streamed answer;
//  - json_schema strict: 20 random schemas of the documented subset, each answer validates;
//  - a schema keyword outside the subset is a 400 naming it;
//  - reasoning split on a template that thinks (DeepSeek R1's), streamed and not.
"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const OpenAI = require("openai").default;
const Anthropic = require("@anthropic-ai/sdk").default;
const Ajv = require("ajv").default;
const addFormats = require("ajv-formats").default;

const port = process.env.BASE_PORT;
const openai = new OpenAI({baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "none", maxRetries: 0});
const anthropic = new Anthropic({baseURL: `http://127.0.0.1:${port}`, apiKey: "none", maxRetries: 0});
const ajv = new Ajv({strict: false, allErrors: true});
addFormats(ajv);

const weather = {
  type: "object",
  properties: {
    city: {type: "string", maxLength: 24, description: "City name"},
    unit: {enum: ["celsius", "fahrenheit"]},
    days: {type: "integer"},
  },
  required: ["city", "unit"],
  additionalProperties: false,
};
const openaiTools = [{type: "function", function: {name: "get_weather", description: "Weather in a city", parameters: weather}}];
const anthropicTools = [{name: "get_weather", description: "Weather in a city", input_schema: weather}];
const question = [{role: "user", content: "What is the weather in Paris?"}];

function expectValid(schema, value, what) {
  const validate = ajv.compile(schema);
  assert.ok(validate(value), `${what}: ${JSON.stringify(value)} does not validate: ${ajv.errorsText(validate.errors)}`);
}

test("OpenAI: tool_choice required gives a call whose arguments validate; the result goes back", async () => {
  const r = await openai.chat.completions.create({
    model: "tiny", messages: question, tools: openaiTools, tool_choice: "required",
    parallel_tool_calls: false, temperature: 0, max_tokens: 200,
  });
  const choice = r.choices[0];
  assert.equal(choice.finish_reason, "tool_calls");
  assert.equal(choice.message.tool_calls.length, 1);
  const call = choice.message.tool_calls[0];
  assert.equal(call.type, "function");
  assert.equal(call.function.name, "get_weather");
  assert.match(call.id, /^call_/);
  expectValid(weather, JSON.parse(call.function.arguments), "arguments");

  // The round trip: the call and its result in the history, the answer is text.
  const r2 = await openai.chat.completions.create({
    model: "tiny", temperature: 0, max_tokens: 16, tools: openaiTools,
    messages: [...question, choice.message, {role: "tool", tool_call_id: call.id, content: "18 C, sunny"}],
  });
  assert.equal(r2.choices[0].message.role, "assistant");
  assert.ok(r2.usage.prompt_tokens > r.usage.prompt_tokens);
});

test("OpenAI: a named tool_choice, and tool_choice none gives text", async () => {
  const r = await openai.chat.completions.create({
    model: "tiny", messages: question, tools: openaiTools, parallel_tool_calls: false,
    tool_choice: {type: "function", function: {name: "get_weather"}}, temperature: 0, max_tokens: 200,
  });
  assert.equal(r.choices[0].message.tool_calls[0].function.name, "get_weather");
  const none = await openai.chat.completions.create({
    model: "tiny", messages: question, tools: openaiTools, tool_choice: "none", temperature: 0, max_tokens: 8,
  });
  assert.equal(none.choices[0].message.tool_calls, undefined);
  assert.equal(typeof none.choices[0].message.content, "string");
});

test("OpenAI: streamed tool-call deltas reassemble into the same call", async () => {
  const params = {model: "tiny", messages: question, tools: openaiTools, tool_choice: "required",
                  parallel_tool_calls: false, temperature: 0, max_tokens: 200};
  const whole = (await openai.chat.completions.create(params)).choices[0].message.tool_calls[0];
  const stream = await openai.chat.completions.create({...params, stream: true});
  const calls = [];
  let fragments = 0, finish = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      if (c.finish_reason) finish = c.finish_reason;
      for (const tc of c.delta.tool_calls || []) {
        const call = (calls[tc.index] = calls[tc.index] || {id: tc.id, name: "", arguments: ""});
        if (tc.function?.name) call.name += tc.function.name;
        if (tc.function?.arguments) { call.arguments += tc.function.arguments; ++fragments; }
      }
    }
  }
  assert.equal(finish, "tool_calls");
  assert.equal(calls.length, 1);
  assert.equal(calls[0].name, whole.function.name);
  assert.equal(calls[0].arguments, whole.function.arguments);
  assert.ok(fragments > 1, `arguments came in ${fragments} fragment(s)`);
  // The SDK's own stream helper assembles the same call.
  const helper = openai.chat.completions.stream(params);
  const final = await helper.finalChatCompletion();
  assert.equal(final.choices[0].message.tool_calls[0].function.arguments, whole.function.arguments);
});

test("Anthropic: tool_choice any gives tool_use whose input validates; tool_result goes back", async () => {
  const m = await anthropic.messages.create({
    model: "tiny", max_tokens: 200, temperature: 0, messages: question, tools: anthropicTools,
    tool_choice: {type: "any", disable_parallel_tool_use: true},
  });
  assert.equal(m.stop_reason, "tool_use");
  const use = m.content.find((b) => b.type === "tool_use");
  assert.ok(use, JSON.stringify(m.content));
  assert.equal(use.name, "get_weather");
  assert.match(use.id, /^toolu_/);
  expectValid(weather, use.input, "input");

  const m2 = await anthropic.messages.create({
    model: "tiny", max_tokens: 16, temperature: 0, tools: anthropicTools,
    messages: [...question, {role: "assistant", content: m.content},
               {role: "user", content: [{type: "tool_result", tool_use_id: use.id, content: "18 C, sunny"}]}],
  });
  assert.equal(m2.role, "assistant");
  const count = await anthropic.messages.countTokens({model: "tiny", messages: question, tools: anthropicTools});
  assert.ok(count.input_tokens > 0);
});

test("Anthropic: streamed input_json_delta reassembles into the same tool_use", async () => {
  const params = {model: "tiny", max_tokens: 200, temperature: 0, messages: question, tools: anthropicTools,
                  tool_choice: {type: "tool", name: "get_weather", disable_parallel_tool_use: true}};
  const whole = (await anthropic.messages.create(params)).content.find((b) => b.type === "tool_use");
  let partial = "", deltas = 0;
  const stream = anthropic.messages.stream(params);
  stream.on("inputJson", (delta) => { partial += delta; ++deltas; });
  const final = await stream.finalMessage();
  const use = final.content.find((b) => b.type === "tool_use");
  assert.deepEqual(use.input, whole.input);
  assert.deepEqual(JSON.parse(partial), whole.input);
  // How many deltas depends on timing: tokens generated while the stream was writing go out
  // together. That arguments stream piece by piece is checked token by token in
  // tool_format_test.cpp.
  assert.ok(deltas >= 1, `input came in ${deltas} delta(s)`);
});

// Random schemas of the documented subset (strings bounded, so a small model ends them).
function randomSchema(rnd, depth, defs) {
  const pick = (n) => Math.floor(rnd() * n);
  switch (depth >= 2 ? pick(6) : pick(10)) {
    case 0: return {type: "string", maxLength: 1 + pick(16)};
    case 1: return {type: "integer"};
    case 2: return {type: ["number", "boolean"][pick(2)]};
    case 3: return {enum: ["red", "green", "blue", 7, null]};
    case 4: return {type: "string", format: ["date", "time", "date-time", "uuid"][pick(4)]};
    case 5: return {type: ["string", "null"], maxLength: 6};
    case 6: case 7: {
      const props = {}, required = [];
      const n = 1 + pick(3);
      for (let i = 0; i < n; i++) {
        const k = "field_" + String.fromCharCode(97 + i);
        props[k] = randomSchema(rnd, depth + 1, defs);
        if (pick(2)) required.push(k);
      }
      return {type: "object", properties: props, required, additionalProperties: false};
    }
    case 8: {
      const lo = pick(2);
      return {type: "array", items: randomSchema(rnd, depth + 1, defs), minItems: lo, maxItems: lo + 1 + pick(2)};
    }
    default: {
      const name = "d" + Object.keys(defs).length;
      defs[name] = randomSchema(rnd, depth + 1, defs);
      return {anyOf: [{$ref: `#/$defs/${name}`}, {type: "null"}]};
    }
  }
}

test("OpenAI: json_schema strict output validates for 20 random schemas", async () => {
  let seed = 12345;
  const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
  for (let i = 0; i < 20; i++) {
    const defs = {};
    const root = {type: "object", properties: {answer: randomSchema(rnd, 0, defs), note: randomSchema(rnd, 1, defs)},
                  required: ["answer", "note"], additionalProperties: false};
    if (Object.keys(defs).length) root.$defs = defs;
    const r = await openai.chat.completions.create({
      model: "tiny", temperature: 0, max_tokens: 400, seed: i,
      messages: [{role: "user", content: "Reply in JSON."}],
      response_format: {type: "json_schema", json_schema: {name: "out", strict: true, schema: root}},
    });
    const c = r.choices[0];
    assert.equal(c.finish_reason, "stop", `schema ${i} ${JSON.stringify(root)}: cut short: ${c.message.content}`);
    let value;
    assert.doesNotThrow(() => { value = JSON.parse(c.message.content); }, `schema ${i}: not JSON: ${c.message.content}`);
    expectValid(root, value, `schema ${i} ${JSON.stringify(root)}`);
  }
});

test("an unsupported schema keyword is a 400 naming it", async () => {
  await assert.rejects(
    openai.chat.completions.create({
      model: "tiny", messages: question, max_tokens: 8,
      response_format: {type: "json_schema", json_schema: {name: "x", schema: {type: "object",
        properties: {code: {type: "string", pattern: "^[A-Z]{3}$"}}}}},
    }),
    (e) => e.status === 400 && /pattern/.test(e.message));
  await assert.rejects(
    anthropic.messages.create({
      model: "tiny", max_tokens: 8, messages: question, tool_choice: {type: "any"},
      tools: [{name: "t", input_schema: {type: "object", properties: {n: {type: "integer", minimum: 1}}}}],
    }),
    (e) => e.status === 400 && /minimum/.test(e.message));
});

test("reasoning is split on a template that thinks", {skip: !process.env.THINK_PORT && "no DeepSeek R1 template in ../shared"}, async () => {
  const base = `http://127.0.0.1:${process.env.THINK_PORT}`;
  const oa = new OpenAI({baseURL: base + "/v1", apiKey: "none", maxRetries: 0});
  const an = new Anthropic({baseURL: base, apiKey: "none", maxRetries: 0});
  // The template ends the prompt inside <think>; a grammar makes the tiny model close it.
  const grammar = 'root ::= [a-z ]{4,30} "</think>" "\\n\\n" [a-z]{4,30}';
  const params = {model: "tiny", temperature: 0, max_tokens: 80, messages: question, grammar};
  const r = await oa.chat.completions.create(params);
  const msg = r.choices[0].message;
  assert.ok(msg.reasoning_content && msg.reasoning_content.length >= 4, JSON.stringify(msg));
  assert.ok(msg.content.length >= 4 && !msg.content.includes("</think>"), JSON.stringify(msg));
  let reasoning = "", content = "";
  for await (const chunk of await oa.chat.completions.create({...params, stream: true})) {
    for (const c of chunk.choices) {
      reasoning += c.delta.reasoning_content || "";
      content += c.delta.content || "";
    }
  }
  assert.equal(reasoning, msg.reasoning_content);
  assert.equal(content, msg.content);
  const m = await an.messages.create({...params, max_tokens: 80});
  assert.equal(m.content[0].type, "thinking");
  assert.equal(m.content[0].thinking, msg.reasoning_content);
  assert.equal(m.content[1].text, msg.content);
  const streamed = await an.messages.stream({...params, max_tokens: 80}).finalMessage();
  assert.equal(streamed.content[0].thinking, msg.reasoning_content);
  assert.equal(streamed.content[1].text, msg.content);
});

test("usage reports cached tokens; n > 1, logit_bias, stop and seed", async () => {
  const long = [{role: "system", content: "You are a careful Python assistant. ".repeat(20)}, ...question];
  await openai.chat.completions.create({model: "tiny", messages: long, max_tokens: 4, temperature: 0});
  const again = await openai.chat.completions.create({model: "tiny", messages: long, max_tokens: 4, temperature: 0});
  assert.ok(again.usage.prompt_tokens_details.cached_tokens > 100, JSON.stringify(again.usage));
  const m = await anthropic.messages.create({model: "tiny", messages: long.slice(1), system: long[0].content, max_tokens: 4});
  assert.ok(m.usage.cache_read_input_tokens > 100, JSON.stringify(m.usage));

  const n = await openai.chat.completions.create({model: "tiny", messages: question, max_tokens: 12, n: 3, temperature: 1, seed: 7});
  assert.equal(n.choices.length, 3);
  const n2 = await openai.chat.completions.create({model: "tiny", messages: question, max_tokens: 12, n: 3, temperature: 1, seed: 7});
  assert.deepEqual(n2.choices.map((c) => c.message.content), n.choices.map((c) => c.message.content));
  await assert.rejects(openai.chat.completions.create({model: "tiny", messages: question, stop: ["a", "b", "c", "d", "e"]}),
                       (e) => e.status === 400);
});
