// An upstream MCP server written with the official TypeScript SDK
// (@modelcontextprotocol/sdk, McpServer), for taskgate to connect to as a
// client.
//
//   node upstream_ts.mjs stdio
//   node upstream_ts.mjs http PORT
//
// It speaks only the legacy `initialize` lifecycle (2025-11-25 and older):
// a 2026-07-28 `server/discover` gets -32601 Method not found over stdio,
// and HTTP 400 (no session id) over HTTP.
//
// Over HTTP it serves streamable HTTP at http://127.0.0.1:PORT/mcp through
// node's http module. It is stateful by default: initialize creates a
// session (an McpServer and a StreamableHTTPServerTransport of its own) and
// the response carries its Mcp-Session-Id; a later request without one is
// refused with HTTP 400, one with an unknown id with HTTP 404, as in the
// SDK's own examples. With UPSTREAM_STATELESS=1 every POST gets a fresh
// server and transport and no session id is handed out. POST responses are
// SSE streams unless UPSTREAM_JSON_RESPONSE=1 asks for application/json.
// With PORT 0 it picks a free port; in both HTTP cases it prints
// `LISTENING <port>` on one stdout line once it accepts connections. Over
// stdio nothing but MCP goes to stdout.
//
// Tools:
//   echo(text)             returns text
//   slow(seconds, marker)  appends "started <pid>" to the file marker, sleeps,
//                          appends "finished" and returns "slept"; when the
//                          call is cancelled it appends "cancelled" instead
//   fail(message)          a tool error (isError true) whose text is message
//   big(bytes)             a string of that many 'x'
//
// With UPSTREAM_HEADER_LOG set (HTTP only), every HTTP request's method,
// path and headers (names lower-cased) are appended to that file, one JSON
// object a line: {"method": ..., "path": ..., "headers": {...}}.

import { appendFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { randomUUID } from 'node:crypto';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';

function text(value) {
  return { content: [{ type: 'text', text: value }] };
}

function buildServer() {
  const server = new McpServer({ name: 'upstream-ts', version: '1.0.0' });

  server.registerTool('echo', {
    description: 'Returns the text.',
    inputSchema: { text: z.string() },
  }, async ({ text: value }) => text(value));

  server.registerTool('slow', {
    description: 'Sleeps for the given seconds, recording its progress in the marker file.',
    inputSchema: { seconds: z.number(), marker: z.string() },
  }, async ({ seconds, marker }, extra) => {
    appendFileSync(marker, `started ${process.pid}\n`);
    // notifications/cancelled aborts the request's signal.
    const cancelled = await new Promise((resolve) => {
      const timer = setTimeout(() => resolve(false), seconds * 1000);
      extra.signal.addEventListener('abort', () => {
        clearTimeout(timer);
        resolve(true);
      }, { once: true });
    });
    if (cancelled) {
      appendFileSync(marker, 'cancelled\n');
      throw new Error('cancelled');
    }
    appendFileSync(marker, 'finished\n');
    return text('slept');
  });

  server.registerTool('fail', {
    description: 'Fails with the message as a tool error.',
    inputSchema: { message: z.string() },
  }, async ({ message }) => {
    // McpServer turns a thrown error into a result with isError true
    // whose text is the error's message.
    throw new Error(message);
  });

  server.registerTool('big', {
    description: "Returns a string of that many 'x'.",
    inputSchema: { bytes: z.number().int().nonnegative() },
  }, async ({ bytes }) => text('x'.repeat(bytes)));

  return server;
}

function logHeaders(req) {
  const path = process.env.UPSTREAM_HEADER_LOG;
  if (!path) return;
  const headers = {};
  for (let i = 0; i < req.rawHeaders.length; i += 2) {
    const name = req.rawHeaders[i].toLowerCase();
    const value = req.rawHeaders[i + 1];
    headers[name] = name in headers ? `${headers[name]}, ${value}` : value;
  }
  const url = new URL(req.url, 'http://127.0.0.1');
  appendFileSync(path, JSON.stringify({ method: req.method, path: url.pathname, headers }) + '\n');
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    req.on('data', (chunk) => chunks.push(chunk));
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    req.on('error', reject);
  });
}

function sendJsonRpcError(res, status, code, message) {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify({ jsonrpc: '2.0', error: { code, message }, id: null }));
}

async function serveHttp(port) {
  const stateless = process.env.UPSTREAM_STATELESS === '1';
  const enableJsonResponse = process.env.UPSTREAM_JSON_RESPONSE === '1';
  const sessions = new Map();

  const httpServer = createServer(async (req, res) => {
    try {
      logHeaders(req);
      const url = new URL(req.url, 'http://127.0.0.1');
      if (url.pathname !== '/mcp') {
        res.writeHead(404).end();
        return;
      }
      let body;
      if (req.method === 'POST') {
        const raw = await readBody(req);
        try {
          body = JSON.parse(raw);
        } catch {
          sendJsonRpcError(res, 400, -32700, 'Parse error');
          return;
        }
      }

      if (stateless) {
        if (req.method !== 'POST') {
          sendJsonRpcError(res, 405, -32000, 'Method not allowed.');
          return;
        }
        const server = buildServer();
        const transport = new StreamableHTTPServerTransport({
          sessionIdGenerator: undefined,
          enableJsonResponse,
        });
        res.on('close', () => {
          transport.close();
          server.close();
        });
        await server.connect(transport);
        await transport.handleRequest(req, res, body);
        return;
      }

      const sessionId = req.headers['mcp-session-id'];
      if (sessionId !== undefined) {
        const transport = sessions.get(sessionId);
        if (!transport) {
          sendJsonRpcError(res, 404, -32001, 'Session not found');
          return;
        }
        await transport.handleRequest(req, res, body);
        return;
      }
      if (req.method === 'POST' && isInitializeRequest(body)) {
        const server = buildServer();
        const transport = new StreamableHTTPServerTransport({
          sessionIdGenerator: () => randomUUID(),
          enableJsonResponse,
          onsessioninitialized: (id) => sessions.set(id, transport),
        });
        transport.onclose = () => {
          if (transport.sessionId) sessions.delete(transport.sessionId);
        };
        await server.connect(transport);
        await transport.handleRequest(req, res, body);
        return;
      }
      sendJsonRpcError(res, 400, -32000, 'Bad Request: No valid session ID provided');
    } catch (error) {
      process.stderr.write(`upstream_ts: ${error?.stack ?? error}\n`);
      if (!res.headersSent) sendJsonRpcError(res, 500, -32603, 'Internal server error');
    }
  });

  httpServer.listen(port, '127.0.0.1', () => {
    process.stdout.write(`LISTENING ${httpServer.address().port}\n`);
  });
}

async function main() {
  const args = process.argv.slice(2);
  if (args.length === 1 && args[0] === 'stdio') {
    await buildServer().connect(new StdioServerTransport());
  } else if (args.length === 2 && args[0] === 'http' && /^\d+$/.test(args[1])) {
    await serveHttp(Number(args[1]));
  } else {
    process.stderr.write('usage: upstream_ts.mjs stdio | http PORT\n');
    process.exit(2);
  }
}

main();
