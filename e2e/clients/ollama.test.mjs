// The Ollama JavaScript library (ollama) against fair_queue in front of
// the mock, which speaks Ollama's native API (/api/chat, /api/generate):
// its streams are NDJSON, its errors {"error": "..."}.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Ollama } from 'ollama';

import { base, baseURL, hold, recorder, tokens, answerOf, untilBody } from './lib.mjs';

const client = (queue, rec, headers) =>
  new Ollama({ host: `${base}/ollama/${queue}`, fetch: rec.fetch, headers });
const messages = [{ role: 'user', content: 'Say hello.' }];

test('a timeout reject is a ResponseError with status 429 and the message as the error', async () => {
  const release = await hold(baseURL('ollama', 'timeout'));
  const rec = recorder();
  try {
    await assert.rejects(client('timeout', rec).chat({ model: 'mock', messages }), (err) => {
      assert.equal(err.name, 'ResponseError', `got ${err.name}: ${err.message}`);
      assert.equal(err.status_code, 429);
      assert.match(err.error, /^The server is busy: the request waited 1(\.\d)?s in the queue without being served\. Please retry after 3 seconds\.$/);
      return true;
    });
    assert.equal(rec.attempts[0].retryAfter, '3');
    assert.equal(rec.attempts[0].contentType, 'application/json');
  } finally {
    await release();
  }
});

test('a streaming timeout reject is a ResponseError too, before any chunk', async () => {
  const release = await hold(baseURL('ollama', 'timeout'));
  const rec = recorder();
  try {
    await assert.rejects(client('timeout', rec).generate({ model: 'mock', prompt: 'hi', stream: true }), (err) => {
      assert.equal(err.name, 'ResponseError', `got ${err.name}: ${err.message}`);
      assert.equal(err.status_code, 429);
      return true;
    });
  } finally {
    await release();
  }
});

test('a granted stream yields every token, and the chunks it waited with carry no text', async () => {
  const release = await hold(baseURL('ollama', 'keepalive'));
  const rec = recorder();
  const n = 7;
  const stream = await client('keepalive', rec, tokens(n)).chat({ model: 'mock', messages, stream: true });
  // A few keepalive chunks, a line each.
  await untilBody(rec, (body) => body.split('\n').filter((l) => l.trim() !== '').length >= 3);
  const releasing = release();
  let text = '';
  let parts = 0;
  let last;
  for await (const part of stream) {
    text += part.message.content;
    parts++;
    last = part;
  }
  await releasing;
  assert.equal(text, answerOf(n));
  assert.ok(parts > n + 1, `waiting chunks came before the answer (${parts} parts)`);
  assert.equal(last.done, true);
  assert.equal(last.eval_count, n);
  assert.equal(rec.attempts[0].contentType, 'application/x-ndjson');
});

test('a reject on a stream that waited with chunks is thrown while iterating', async () => {
  const release = await hold(baseURL('ollama', 'keepalive'));
  const rec = recorder();
  try {
    const stream = await client('keepalive', rec).chat({ model: 'mock', messages, stream: true });
    await assert.rejects(async () => { for await (const part of stream) assert.equal(part.message.content, ''); }, (err) => {
      assert.match(err.message, /^The server is busy: the request waited 3(\.\d)?s in the queue/);
      return true;
    });
  } finally {
    await release();
  }
});

test('an upstream redirect on a stream that waited with chunks is thrown while iterating', async () => {
  const release = await hold(baseURL('ollama', 'redirect-hold'));
  const stream = await client('redirect', recorder()).chat({ model: 'mock', messages, stream: true });
  await new Promise((r) => setTimeout(r, 500)); // a few waiting chunks
  await release();
  await assert.rejects(async () => { for await (const part of stream) assert.equal(part.message.content, ''); }, (err) => {
    assert.equal(err.message, 'The upstream server answered with status 308 Permanent Redirect.');
    return true;
  });
});
