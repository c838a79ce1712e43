// serve_conns.cjs - slow and idle clients for tests/test_serve_http.sh, on
// 127.0.0.1 only, each bounded in time.
// Usage:
//   node serve_conns.cjs trickle PORT headers|body LIMIT_S
//     sends a request one byte a second (the headers, or after whole headers
//     the body); prints "closed after S s" and exits 0 when the server closes
//     the connection, or "still open after LIMIT_S s" and exits 1.
//   node serve_conns.cjs hold PORT N SECONDS
//     opens N connections that send nothing, prints "ready" once all are
//     connected and "closed after S s" for each the server closes, holds
//     them SECONDS (or until killed), then exits 0.
'use strict';
const net = require('net');
const [mode, port, a, b] = process.argv.slice(2);
const t0 = Date.now();
const secs = () => ((Date.now() - t0) / 1000).toFixed(1);

if (mode === 'trickle') {
  const limit = +b;
  const body = '{"prompt":"x","max_tokens":1}'.padEnd(100, ' ');
  const head = 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n' +
    'Content-Length: ' + body.length + '\r\nX-Pad: ' + 'a'.repeat(200) + '\r\n\r\n';
  const s = net.connect(+port, '127.0.0.1', () => {
    let sent = a === 'body' ? head : '';
    if (sent) s.write(sent);
    const all = head + body;
    let i = sent.length;
    // one byte a second: each resets an idle timeout, none completes the request
    const iv = setInterval(() => { if (i < all.length) s.write(all[i++]); }, 1000);
    s.on('close', () => { clearInterval(iv); console.log('closed after ' + secs() + ' s'); process.exit(0); });
  });
  s.on('error', () => {});
  s.on('data', () => {});
  setTimeout(() => { console.log('still open after ' + limit + ' s'); process.exit(1); }, limit * 1000);
} else if (mode === 'hold') {
  const n = +a;
  let up = 0;
  for (let k = 0; k < n; k++) {
    const s = net.connect(+port, '127.0.0.1', () => { if (++up === n) console.log('ready'); });
    s.on('error', () => {});
    s.on('close', () => console.log('closed after ' + secs() + ' s'));
  }
  setTimeout(() => process.exit(0), +b * 1000);
} else {
  console.log('usage: serve_conns.cjs trickle PORT headers|body LIMIT_S | hold PORT N SECONDS');
  process.exit(2);
}
