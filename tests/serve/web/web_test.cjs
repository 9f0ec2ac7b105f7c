// The page at / in headless Chromium (driven by playwright-core): it loads from the running
// server, a message sent streams an answer into the chat, the engine plots update from
// /v1/runtime/events (their sample counts grow, the ledger plot names the accounts), JSON
// mode gives a JSON answer; the screenshot stays in $OUT/page.png.
"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const path = require("node:path");
const {chromium} = require("playwright-core");

test("the page chats with streaming and plots the engine live", async () => {
  // A fresh profile folder (run.sh empties it): playwright's persistent context takes it.
  const browser = await chromium.launchPersistentContext(path.join(process.env.OUT, "profile"), {
    executablePath: process.env.CHROMIUM,
    headless: true,
    viewport: {width: 1280, height: 800},
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run"],
  });
  try {
    const page = await browser.newPage();
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    await page.goto(`http://127.0.0.1:${process.env.BASE_PORT}/`);
    assert.equal(await page.title(), "substrate");
    // The model's name arrives with the first stats event.
    await page.waitForFunction(() => document.getElementById("model").textContent.includes("tiny-coder"));
    const samples = (id) => page.$eval(`#${id}`, (e) => Number(e.dataset.samples));
    const before = await samples("plot-tps");

    await page.fill("#temperature", "0");
    await page.fill("#max-tokens", "48");
    await page.fill("#input", "def fibonacci(n):");
    await page.click("#send");
    const answer = page.locator(".msg.assistant").last();
    // Streaming: text shows while the answer is still running, then it completes.
    await page.waitForFunction(() => {
      const m = [...document.querySelectorAll(".msg.assistant")].pop();
      return m && m.querySelector(".content").textContent.length > 0;
    });
    await page.waitForSelector('.msg.assistant[data-done="true"]');
    const text = await answer.locator(".content").textContent();
    assert.ok(text.length > 10, `answer: ${text}`);
    assert.ok(!(await answer.getAttribute("class")).includes("error"));
    assert.match(await answer.locator(".meta").textContent(), /48 tokens/);

    // The plots keep updating (one sample per 500 ms event).
    await page.waitForFunction((b) => Number(document.getElementById("plot-tps").dataset.samples) >= b + 4, before);
    for (const id of ["plot-memory", "plot-ops", "plot-tiers", "plot-experts", "plot-disk"])
      assert.ok((await samples(id)) >= 2, `${id} did not update`);
    const accounts = await page.$eval("#plot-memory", (e) => e.dataset.series);
    assert.match(accounts, /total/);
    assert.ok(accounts.split(",").length >= 2, `ledger accounts: ${accounts}`);
    assert.match(await page.$eval("#plot-ops .value", (e) => e.textContent), /resident/);
    // A resident model: every op at one tier, nothing escalated.
    assert.match(await page.$eval("#plot-tiers", (e) => e.dataset.series), /^tier \d+$/);
    // tokens/s rose while the answer was generated (the plot's last samples cover it).
    const tps = await page.$eval("#plot-tps .value", (e) => Number(e.textContent));
    assert.ok(Number.isFinite(tps));

    // JSON mode: the request asks for a JSON object and the answer is one. A tiny model may repeat
    // keys until max_tokens ends it: then what came is the start of an object (the grammar tests
    // check that every finished answer parses).
    const bodies = [];
    page.on("request", (r) => r.url().endsWith("/v1/chat/completions") && bodies.push(r.postDataJSON()));
    await page.check("#json-toggle");
    await page.fill("#max-tokens", "120");
    await page.fill("#input", "Describe fibonacci as JSON.");
    await page.click("#send");
    await page.waitForFunction(() => document.querySelectorAll('.msg.assistant[data-done="true"]').length === 2);
    assert.deepEqual(bodies.pop().response_format, {type: "json_object"});
    const last = page.locator(".msg.assistant").last();
    const json = await last.locator(".content").textContent();
    const meta = await last.locator(".meta").textContent();
    if (/^120 tokens/.test(meta)) {
      assert.match(json, /^\s*\{/, `${meta}: ${json}`);
    } else {
      assert.equal(typeof JSON.parse(json), "object", `${meta}: ${json}`);
    }

    await page.screenshot({path: path.join(process.env.OUT, "page.png"), fullPage: true});
    assert.deepEqual(errors, []);
  } finally {
    await browser.close();
  }
});
