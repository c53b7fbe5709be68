// Shared by the client library tests: where fair_queue is, a request
// that holds a queue's only permit, and a fetch that records what went
// over the wire. The Go test in this folder (clients_test.go) starts
// Caddy and the mock LLM and sets FAIR_QUEUE_URL.
import assert from 'node:assert/strict';

export const base = process.env.FAIR_QUEUE_URL;
assert.ok(base, 'FAIR_QUEUE_URL is set by clients_test.go (make e2e)');

// Queues of the test config, each with one permit, under /<lib>/<queue>/v1:
//   timeout    max_wait 1s; a timeout's Retry-After is 3s
//   keepalive  max_wait 3s; sse_keepalive 200ms
//   events     max_wait 3s; sse_keepalive 200ms with sse_queue_events
//   sse429     max_wait 1s; a streaming timeout is answered 429 (reject sse_status 429)
//   retry60    max_wait 1s; a timeout's Retry-After is 60s
//   nostore    its Redis is unreachable, on_store_error fail_closed: 503 store_unavailable at once
//   redirect   max_wait 3s; sse_keepalive 200ms; the upstream answers with a redirect
//              (hold its permit through redirect-hold, the same queue in front of the mock)
export const baseURL = (lib, queue) => `${base}/${lib}/${queue}/v1`;

// The mock answers with "tok " tokens; this header sets how many.
export const tokens = (n) => ({ 'X-Mock-Tokens': String(n) });
export const answerOf = (n) => 'tok '.repeat(n);

// hold takes the only permit of a queue with a streaming request that
// lasts minutes, and returns once it is granted. The body is read to the
// end: an unread body can be collected and its connection closed.
export async function hold(url) {
  const ac = new AbortController();
  const resp = await fetch(`${url}/chat/completions`, {
    method: 'POST',
    signal: ac.signal,
    headers: { 'Content-Type': 'application/json', 'X-Mock-Tokens': '6000', 'X-Mock-Delay': '100ms' },
    body: JSON.stringify({ model: 'mock', stream: true, messages: [{ role: 'user', content: 'hold' }] }),
  });
  assert.equal(resp.status, 200);
  assert.equal(resp.headers.get('fair-queue-reason'), null, 'the holder got its permit');
  const reader = resp.body.getReader();
  const drained = (async () => {
    try {
      for (;;) if ((await reader.read()).done) break;
    } catch { /* released */ }
  })();
  return async () => {
    ac.abort();
    await drained;
    // The permit is handed on 50 ms after the proxied request returns.
    await new Promise((r) => setTimeout(r, 150));
  };
}

// recorder returns a fetch for a client library that records each
// attempt (start and answer time in ms, status, Retry-After) and the raw
// body the library read, so that a test sees what reached the wire and
// what the library made of it.
export function recorder() {
  const t0 = performance.now();
  const attempts = [];
  const fetchFn = async (input, init) => {
    const a = { start: performance.now() - t0, body: '' };
    attempts.push(a);
    const resp = await fetch(input, init);
    a.answered = performance.now() - t0;
    a.status = resp.status;
    a.retryAfter = resp.headers.get('retry-after');
    a.contentType = resp.headers.get('content-type');
    if (!resp.body) return resp;
    const [mine, theirs] = resp.body.tee();
    a.done = (async () => {
      const dec = new TextDecoder();
      const reader = mine.getReader();
      try {
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          a.body += dec.decode(value, { stream: true });
        }
      } catch { /* the library cancelled */ }
    })();
    return new Response(theirs, { status: resp.status, statusText: resp.statusText, headers: resp.headers });
  };
  return { fetch: fetchFn, attempts };
}

// assertRetriesHonourRetryAfter checks that a library tried 3 times (its
// default: 2 retries), each answered 429 with Retry-After 3, and waited
// those 3 s before each retry (not its own backoff).
export function assertRetriesHonourRetryAfter(attempts) {
  assert.equal(attempts.length, 3, 'one try and 2 retries');
  for (const a of attempts) {
    assert.equal(a.status, 429);
    assert.equal(a.retryAfter, '3');
  }
  for (let i = 1; i < attempts.length; i++) {
    const pause = attempts[i].start - attempts[i - 1].answered;
    assert.ok(pause >= 2950 && pause < 3900, `retry ${i} came ${Math.round(pause)} ms after the 429, want Retry-After's 3000 ms`);
  }
}

// untilBody waits until the raw body of rec's first attempt satisfies
// ok, or for 2.5 s (under the keepalive queues' max_wait of 3 s): the
// test's own assertions then say what came.
export async function untilBody(rec, ok) {
  const deadline = performance.now() + 2500;
  while (performance.now() < deadline) {
    const a = rec.attempts[0];
    if (a && ok(a.body)) return;
    await new Promise((r) => setTimeout(r, 20));
  }
}

// keepaliveComments returns the sse_keepalive comments of a raw SSE body.
export const keepaliveComments = (body) => body.split('\n').filter((l) => l.startsWith(': queued'));
