// The OpenAI Node SDK (openai) against fair_queue in front of the mock LLM.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

import { baseURL, hold, recorder, tokens, answerOf, assertRetriesHonourRetryAfter, keepaliveComments, untilBody } from './lib.mjs';

const client = (queue, rec) => new OpenAI({ baseURL: baseURL('openai', queue), apiKey: 'unused', fetch: rec.fetch });
const messages = [{ role: 'user', content: 'Say hello.' }];

test('a timeout reject is a RateLimitError (429) after 2 retries that wait Retry-After', async () => {
  const release = await hold(baseURL('openai', 'timeout'));
  const rec = recorder();
  try {
    await assert.rejects(client('timeout', rec).chat.completions.create({ model: 'mock', messages }), (err) => {
      assert.ok(err instanceof OpenAI.RateLimitError, `got ${err.constructor.name}: ${err.message}`);
      assert.equal(err.status, 429);
      assert.equal(err.code, 'timeout');
      assert.equal(err.type, 'rate_limit_exceeded');
      assert.equal(err.headers.get('fair-queue-reason'), 'timeout');
      assert.match(err.message, /^429 The server is busy: the request waited 1(\.\d)?s in the queue without being served\. Please retry after 3 seconds\.$/);
      return true;
    });
    assertRetriesHonourRetryAfter(rec.attempts);
  } finally {
    await release();
  }
});

test('a streaming timeout reject is thrown by the stream (an APIError), not an empty stream', async () => {
  const release = await hold(baseURL('openai', 'timeout'));
  const rec = recorder();
  try {
    const stream = await client('timeout', rec).chat.completions.create({ model: 'mock', messages, stream: true });
    const chunks = [];
    await assert.rejects(async () => { for await (const c of stream) chunks.push(c); }, (err) => {
      // The reject comes as an SSE error event on a 200 stream: the SDK
      // raises it while iterating, as the base APIError without a status
      // (so it does not retry, and Retry-After is not read).
      assert.equal(err.constructor, OpenAI.APIError, `got ${err.constructor.name}: ${err.message}`);
      assert.equal(err.status, undefined);
      assert.equal(err.code, 'timeout');
      assert.match(err.message, /^The server is busy: the request waited 1(\.\d)?s in the queue/);
      return true;
    });
    assert.deepEqual(chunks, []);
    assert.equal(rec.attempts.length, 1);
    assert.equal(rec.attempts[0].status, 200);
  } finally {
    await release();
  }
});

test('a granted stream yields every token, and the keepalive comments it waited with are never content', async () => {
  const release = await hold(baseURL('openai', 'keepalive'));
  const rec = recorder();
  const n = 25;
  const stream = await client('keepalive', rec).chat.completions.create(
    { model: 'mock', messages, stream: true }, { headers: tokens(n) });
  // The header came with the first comment; stay queued for a few more.
  await untilBody(rec, (body) => keepaliveComments(body).length >= 3);
  await release();
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  await rec.attempts[0].done;

  assert.ok(keepaliveComments(rec.attempts[0].body).length >= 3, `comments on the wire: ${rec.attempts[0].body.slice(0, 300)}`);
  assert.equal(chunks.length, n);
  for (const c of chunks) assert.equal(c.object, 'chat.completion.chunk');
  assert.equal(chunks.map((c) => c.choices[0].delta.content).join(''), answerOf(n));
  assert.equal(chunks.at(-1).choices[0].finish_reason, 'stop');
});

test('a streaming reject after keepalive comments is thrown by the stream', async () => {
  const release = await hold(baseURL('openai', 'keepalive'));
  const rec = recorder();
  try {
    const stream = await client('keepalive', rec).chat.completions.create({ model: 'mock', messages, stream: true });
    const chunks = [];
    await assert.rejects(async () => { for await (const c of stream) chunks.push(c); }, (err) => {
      assert.equal(err.constructor, OpenAI.APIError, `got ${err.constructor.name}: ${err.message}`);
      assert.equal(err.code, 'timeout');
      assert.match(err.message, /^The server is busy: the request waited 3(\.\d)?s in the queue/);
      return true;
    });
    assert.deepEqual(chunks, [], 'no comment became a chunk');
    await rec.attempts[0].done;
    assert.ok(keepaliveComments(rec.attempts[0].body).length >= 5);
  } finally {
    await release();
  }
});

test('a plain request granted after waiting gets the whole answer', async () => {
  const release = await hold(baseURL('openai', 'keepalive'));
  const rec = recorder();
  const pending = client('keepalive', rec).chat.completions.create({ model: 'mock', messages }, { headers: tokens(5) });
  await new Promise((r) => setTimeout(r, 500));
  await release();
  const completion = await pending;
  assert.equal(completion.choices[0].message.content, answerOf(5));
  assert.equal(rec.attempts.length, 1);
});

test('a streaming reject answered 429 (reject sse_status 429) is a RateLimitError with the reject\'s message and code',
  async () => {
    const release = await hold(baseURL('openai', 'sse429'));
    const rec = recorder();
    try {
      await assert.rejects(client('sse429', rec).chat.completions.create({ model: 'mock', messages, stream: true }), (err) => {
        assert.ok(err instanceof OpenAI.RateLimitError, `got ${err.constructor.name}`);
        assert.equal(rec.attempts.length, 3, 'retried');
        assert.equal(err.code, 'timeout');
        assert.match(err.message, /^429 The server is busy/);
        return true;
      });
    } finally {
      await release();
    }
  });

// Why sse_queue_events is off by default: the SDK hands every event but
// the thread.* ones to the caller as a chunk.
test('with sse_queue_events, each queue event reaches the caller as a chunk before the tokens', async () => {
  const release = await hold(baseURL('openai', 'events'));
  const rec = recorder();
  const stream = await client('events', rec).chat.completions.create(
    { model: 'mock', messages, stream: true }, { headers: tokens(3) });
  await new Promise((r) => setTimeout(r, 700));
  await release();
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  const queued = chunks.filter((c) => !c.choices);
  assert.ok(queued.length >= 3, `queue events among the chunks: ${JSON.stringify(chunks.slice(0, 2))}`);
  for (const q of queued) assert.deepEqual(Object.keys(q).sort(), ['eta_s', 'position', 'waited_s']);
  assert.equal(chunks.filter((c) => c.choices).map((c) => c.choices[0].delta.content).join(''), answerOf(3));
});

test('a 503 reject (store_unavailable) is an InternalServerError after 2 retries that wait Retry-After', async () => {
  const rec = recorder();
  await assert.rejects(client('nostore', rec).chat.completions.create({ model: 'mock', messages }), (err) => {
    assert.ok(err instanceof OpenAI.InternalServerError, `got ${err.constructor.name}: ${err.message}`);
    assert.equal(err.status, 503);
    assert.equal(err.code, 'store_unavailable');
    assert.equal(err.type, 'server_error');
    return true;
  });
  assert.equal(rec.attempts.length, 3, 'one try and 2 retries');
  for (const a of rec.attempts) {
    assert.equal(a.status, 503);
    assert.equal(a.retryAfter, '1');
  }
  for (let i = 1; i < rec.attempts.length; i++) {
    const pause = rec.attempts[i].start - rec.attempts[i - 1].answered;
    assert.ok(pause >= 950, `retry ${i} came ${Math.round(pause)} ms after the 503, want Retry-After's 1000 ms`);
  }
});

test('an upstream redirect on a stream that waited with keepalive comments is thrown by the stream, not an empty completion',
  async () => {
    const release = await hold(baseURL('openai', 'redirect-hold'));
    const rec = recorder();
    const stream = await client('redirect', rec).chat.completions.create({ model: 'mock', messages, stream: true });
    await new Promise((r) => setTimeout(r, 500)); // a few comments
    await release();
    const chunks = [];
    await assert.rejects(async () => { for await (const c of stream) chunks.push(c); }, (err) => {
      assert.equal(err.constructor, OpenAI.APIError, `got ${err.constructor.name}: ${err.message}`);
      assert.equal(err.code, 'upstream_error');
      assert.equal(err.message, 'The upstream server answered with status 308 Permanent Redirect.');
      return true;
    });
    assert.deepEqual(chunks, []);
  });

// The SDK's streaming helper (chat.completions.stream) reads every chunk
// as a completion chunk: a queue event, which has no choices, fails the
// whole request.
test('with sse_queue_events, the chat.completions.stream() helper fails on the first queue event', async () => {
  const release = await hold(baseURL('openai', 'events'));
  try {
    const stream = client('events', recorder()).chat.completions.stream({ model: 'mock', messages }, { headers: tokens(3) });
    await assert.rejects(stream.finalChatCompletion(), (err) => {
      assert.ok(err instanceof OpenAI.OpenAIError, `got ${err.constructor.name}: ${err.message}`);
      assert.equal(err.message, 'chunk.choices is not iterable');
      return true;
    });
  } finally {
    await release();
  }
});
