// The Vercel AI SDK (ai, with @ai-sdk/openai-compatible) against
// fair_queue in front of the mock LLM.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { generateText, streamText, RetryError, APICallError } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';

import { baseURL, hold, recorder, tokens, answerOf, assertRetriesHonourRetryAfter, keepaliveComments, untilBody } from './lib.mjs';

const model = (queue, rec) =>
  createOpenAICompatible({ name: 'fair-queue', baseURL: baseURL('ai', queue), fetch: rec.fetch }).chatModel('mock');
const prompt = 'Say hello.';

// stream runs streamText to its end and returns what a caller sees: the
// text of textStream, the parts of fullStream, what onError got, and the
// finish reason.
async function stream(options) {
  const errors = [];
  const result = streamText({ ...options, onError: ({ error }) => errors.push(error) });
  const parts = [];
  for await (const p of result.fullStream) parts.push(p);
  let finishReason;
  try {
    finishReason = await result.finishReason;
  } catch (err) {
    finishReason = err;
  }
  return { text: await result.text.catch(() => undefined), parts, errors, finishReason };
}

test('a timeout reject is a RetryError whose last error is the 429 APICallError, after 2 retries that wait Retry-After', async () => {
  const release = await hold(baseURL('ai', 'timeout'));
  const rec = recorder();
  try {
    await assert.rejects(generateText({ model: model('timeout', rec), prompt }), (err) => {
      assert.ok(RetryError.isInstance(err), `got ${err.constructor.name}: ${err.message}`);
      assert.equal(err.reason, 'maxRetriesExceeded');
      assert.equal(err.errors.length, 3);
      const last = err.lastError;
      assert.ok(APICallError.isInstance(last), `last error ${last?.constructor.name}`);
      assert.equal(last.statusCode, 429);
      assert.equal(last.isRetryable, true);
      assert.equal(last.responseHeaders['fair-queue-reason'], 'timeout');
      assert.match(last.message, /^The server is busy: the request waited 1(\.\d)?s in the queue without being served\. Please retry after 3 seconds\.$/);
      return true;
    });
    assertRetriesHonourRetryAfter(rec.attempts);
  } finally {
    await release();
  }
});

// The AI SDK never throws from a stream: an error event becomes an
// error part of fullStream and a call of onError, textStream just ends,
// and the finish reason is "error" (not "stop"). That is how a caller of
// streamText tells a reject from an empty answer.
test('a streaming timeout reject is an error part with the reject (finish reason error), not a clean empty stream', async () => {
  const release = await hold(baseURL('ai', 'timeout'));
  const rec = recorder();
  try {
    const got = await stream({ model: model('timeout', rec), prompt });
    assert.equal(got.text, '');
    const errs = got.parts.filter((p) => p.type === 'error');
    assert.equal(errs.length, 1, `parts: ${got.parts.map((p) => p.type)}`);
    assert.deepEqual(got.errors, [errs[0].error]);
    assert.equal(errs[0].error.code, 'timeout');
    assert.equal(errs[0].error.type, 'rate_limit_exceeded');
    assert.match(errs[0].error.message, /^The server is busy: the request waited 1(\.\d)?s in the queue/);
    assert.equal(got.finishReason, 'error');
    assert.equal(rec.attempts.length, 1, 'a 200 stream is not retried');
  } finally {
    await release();
  }
});

test('a granted stream yields every token, and the keepalive comments it waited with are never content', async () => {
  const release = await hold(baseURL('ai', 'keepalive'));
  const rec = recorder();
  const n = 25;
  const result = streamText({ model: model('keepalive', rec), prompt, headers: tokens(n) });
  const deltas = [];
  const reading = (async () => { for await (const t of result.textStream) deltas.push(t); })();
  await untilBody(rec, (body) => keepaliveComments(body).length >= 3);
  assert.deepEqual(deltas, [], 'nothing while queued');
  await release();
  await reading;
  await rec.attempts[0].done;

  assert.ok(keepaliveComments(rec.attempts[0].body).length >= 3, `comments on the wire: ${rec.attempts[0].body.slice(0, 300)}`);
  assert.equal(deltas.length, n);
  assert.equal(deltas.join(''), answerOf(n));
  assert.equal(await result.finishReason, 'stop');
});

test('a streaming reject after keepalive comments is an error part with the reject', async () => {
  const release = await hold(baseURL('ai', 'keepalive'));
  const rec = recorder();
  try {
    const got = await stream({ model: model('keepalive', rec), prompt });
    assert.equal(got.text, '');
    const errs = got.parts.filter((p) => p.type === 'error');
    assert.equal(errs.length, 1, `parts: ${got.parts.map((p) => p.type)}`);
    assert.equal(errs[0].error.code, 'timeout');
    assert.match(errs[0].error.message, /^The server is busy: the request waited 3(\.\d)?s in the queue/);
    assert.equal(got.finishReason, 'error');
    assert.equal(got.parts.filter((p) => p.type === 'text-delta').length, 0, 'no comment became text');
    await rec.attempts[0].done;
    assert.ok(keepaliveComments(rec.attempts[0].body).length >= 5);
  } finally {
    await release();
  }
});

test('a plain request granted after waiting gets the whole answer', async () => {
  const release = await hold(baseURL('ai', 'keepalive'));
  const rec = recorder();
  const pending = generateText({ model: model('keepalive', rec), prompt, headers: tokens(5) });
  await new Promise((r) => setTimeout(r, 500));
  await release();
  const { text } = await pending;
  assert.equal(text, answerOf(5));
  assert.equal(rec.attempts.length, 1);
});

test('a streaming reject answered 429 (reject sse_status 429) carries the reject\'s message',
  async () => {
    const release = await hold(baseURL('ai', 'sse429'));
    const rec = recorder();
    try {
      const got = await stream({ model: model('sse429', rec), prompt });
      assert.equal(rec.attempts.length, 3, 'retried');
      const [err] = got.errors;
      assert.ok(RetryError.isInstance(err), `got ${err?.constructor.name}`);
      assert.match(err.lastError.message, /^The server is busy/);
    } finally {
      await release();
    }
  });

// Why sse_queue_events is off by default: the SDK cannot parse a queue
// event as a chunk and reports each as an error (to onError, which logs
// by default), though the answer then comes whole.
test('with sse_queue_events, each queue event is an error part before the whole answer', async () => {
  const release = await hold(baseURL('ai', 'events'));
  const rec = recorder();
  const pending = stream({ model: model('events', rec), prompt, headers: tokens(3) });
  await new Promise((r) => setTimeout(r, 700));
  await release();
  const got = await pending;
  const errs = got.parts.filter((p) => p.type === 'error');
  assert.ok(errs.length >= 3, `parts: ${got.parts.map((p) => p.type)}`);
  for (const e of errs) assert.equal(e.error.name, 'AI_TypeValidationError');
  assert.equal(got.errors.length, errs.length);
  assert.equal(got.text, answerOf(3));
  assert.equal(got.finishReason, 'stop');
});

// The AI SDK honours a Retry-After only below 60 s: a longer one (a
// configured retry_after, or auto with a max_wait of a minute or more)
// gives way to its own backoff, 2 s then 4 s.
test('a Retry-After of 60 s is not waited: the retries come after the SDK\'s own backoff', async () => {
  const release = await hold(baseURL('ai', 'retry60'));
  const rec = recorder();
  try {
    await assert.rejects(generateText({ model: model('retry60', rec), prompt }), (err) => {
      assert.ok(RetryError.isInstance(err), `got ${err.constructor.name}: ${err.message}`);
      assert.match(err.lastError.message, /Please retry after 60 seconds\.$/);
      return true;
    });
    assert.equal(rec.attempts.length, 3, 'one try and 2 retries');
    for (const a of rec.attempts) assert.equal(a.retryAfter, '60');
    const pauses = rec.attempts.slice(1).map((a, i) => a.start - rec.attempts[i].answered);
    assert.ok(pauses[0] >= 1900 && pauses[0] < 30000, `first retry after ${Math.round(pauses[0])} ms, want the SDK's 2000`);
    assert.ok(pauses[1] >= 3900 && pauses[1] < 30000, `second retry after ${Math.round(pauses[1])} ms, want the SDK's 4000`);
  } finally {
    await release();
  }
});

test('an upstream redirect on a stream that waited with keepalive comments is an error part (finish reason error)',
  async () => {
    const release = await hold(baseURL('ai', 'redirect-hold'));
    const rec = recorder();
    const pending = stream({ model: model('redirect', rec), prompt });
    // The header comes with the first comment: from then on the request
    // waits on a committed stream.
    while (rec.attempts[0]?.status === undefined) await new Promise((r) => setTimeout(r, 20));
    await new Promise((r) => setTimeout(r, 300)); // a few comments
    await release();
    const got = await pending;
    assert.equal(got.text, '');
    const errs = got.parts.filter((p) => p.type === 'error');
    assert.equal(errs.length, 1, `parts: ${got.parts.map((p) => p.type)}`);
    assert.equal(errs[0].error.code, 'upstream_error');
    assert.equal(errs[0].error.message, 'The upstream server answered with status 308 Permanent Redirect.');
    assert.equal(got.finishReason, 'error');
  });

test('a 503 reject (store_unavailable) is a RetryError whose last error is the 503 APICallError, after 2 retries that wait Retry-After',
  async () => {
    const rec = recorder();
    await assert.rejects(generateText({ model: model('nostore', rec), prompt }), (err) => {
      assert.ok(RetryError.isInstance(err), `got ${err.constructor.name}: ${err.message}`);
      assert.equal(err.reason, 'maxRetriesExceeded');
      assert.equal(err.lastError.statusCode, 503);
      assert.equal(err.lastError.isRetryable, true);
      assert.match(err.lastError.message, /^The request queue is temporarily unavailable\. Please retry after 1 second\.$/);
      return true;
    });
    assert.equal(rec.attempts.length, 3, 'one try and 2 retries');
    for (let i = 1; i < rec.attempts.length; i++) {
      assert.equal(rec.attempts[i].retryAfter, '1');
      const pause = rec.attempts[i].start - rec.attempts[i - 1].answered;
      assert.ok(pause >= 950, `retry ${i} came ${Math.round(pause)} ms after the 503, want Retry-After's 1000 ms`);
    }
  });
