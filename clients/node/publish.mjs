// A reference publisher of the runledger wire format, written from docs/wire.md and tests/vectors.
//
//   node publish.mjs --check-vectors ../../tests/vectors
//       replays the test vectors: canonical JSON, hashes, subjects, headers and msg ids, keyed digests
//   node publish.mjs --server nats://127.0.0.1:4222 --agent node-agent --run-id RUN --key refund:order-1
//       writes a complete run (run.started, a model call, a tool call, an effect with its claim on the
//       key, run.completed) and prints a JSON summary; exits 3 when the key was already claimed
//
// It imports nothing of runledger: every rule below is the page's.

import { createHash, createHmac, randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";

// -- canonical JSON: RFC 8785 (chain format 2) -------------------------------------------------

export function canonicalize(value) {
  if (value === null || typeof value === "boolean") return JSON.stringify(value);
  if (typeof value === "number") {
    if (!Number.isFinite(value)) throw new Error(`not JSON: ${value}`);
    return JSON.stringify(value); // ECMAScript's Number.prototype.toString, as JCS requires (-0 gives "0")
  }
  if (typeof value === "bigint") return value.toString(); // the integer extension: exact digits
  if (typeof value === "string") return JSON.stringify(value); // JSON.stringify escapes exactly as JCS does
  if (Array.isArray(value)) return "[" + value.map(canonicalize).join(",") + "]";
  if (typeof value === "object") {
    // Default sort compares UTF-16 code units: the order JCS prescribes.
    const names = Object.keys(value).filter((k) => value[k] !== undefined).sort();
    return "{" + names.map((k) => JSON.stringify(k) + ":" + canonicalize(value[k])).join(",") + "}";
  }
  throw new Error(`cannot canonicalize ${typeof value}`);
}

const sha256hex = (data) => createHash("sha256").update(data).digest("hex");
export const digest = (value) => sha256hex(Buffer.from(canonicalize(value), "utf8"));
export const keyToken = (key) => sha256hex(Buffer.from(key, "utf8")).slice(0, 32);
// Digest scheme 2 (docs/wire.md, "Digests of content"), for a run with keys: HMAC-SHA256 of the canonical
// JSON under the digest key, HKDF-SHA256-Expand of the data key with info "runledger digest key" (one block:
// HMAC-SHA256(data key, info || 0x01)). This publisher writes unsealed runs (no keys: scheme 1, plain).
export const digestKey = (dataKey) => createHmac("sha256", dataKey).update(Buffer.from("runledger digest key\x01", "latin1")).digest();
export const keyedDigest = (digestKeyBytes, value) => createHmac("sha256", digestKeyBytes).update(Buffer.from(canonicalize(value), "utf8")).digest("hex");
export const GENESIS = "0".repeat(64);

// -- names, subjects, headers ----------------------------------------------------------------

const TOKEN = /^[A-Za-z0-9_-]{1,128}$/;
function token(what, value) {
  if (!TOKEN.test(value)) throw new Error(`${what} ${JSON.stringify(value)}: use 1-128 of A-Z a-z 0-9 _ -`);
  return value;
}
export const runSubject = (agent, runId, writer = "a") => `ledger.run.${token("agent", agent)}.${token("run id", runId)}.${writer}`;
export const keySubject = (agent, key, writer = "a") => `ledger.effect.${token("agent", agent)}.${keyToken(key)}.${writer}`;
export const fenceFilter = (subject) => subject.slice(0, subject.lastIndexOf(".")) + ".*";
/** What an append expecting lastStreamSeq is fenced on: a run's first message claims its run id over
 * every agent's subjects of it (ledger.run.*.<run_id>.*); every other append, the run or key. */
export function fenceFor(subject, lastStreamSeq) {
  const parts = subject.split(".");
  if (lastStreamSeq === 0 && parts.length === 5 && parts[0] === "ledger" && parts[1] === "run") return `ledger.run.*.${parts[3]}.*`;
  return fenceFilter(subject);
}
export const runMsgId = (runId, seq) => `${runId}:${seq}`;
export const keyMsgId = (agent, key, seq) => `effect:${agent}:${keyToken(key)}:${seq}`;
export const FENCE = "Nats-Expected-Last-Subject-Sequence";
export const FENCE_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject";
export const WRONG_LAST_SEQUENCE = 10071;

// -- events and the chain --------------------------------------------------------------------

const CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
export function ulid() {
  let value = (BigInt(Date.now()) << 80n) | BigInt("0x" + randomBytes(10).toString("hex"));
  let out = "";
  for (let i = 0; i < 26; i++) {
    out = CROCKFORD[Number(value & 31n)] + out;
    value >>= 5n;
  }
  return out;
}

export const utcNow = () => new Date().toISOString().replace(/\.(\d{3})Z$/, ".$1000Z");

/** The envelope of the next event and its wire bytes: hash = sha256(prev_hash || canonical(unhashed)). */
export function makeEvent({ id, runId, agent, seq, type, payload, prevHash, ts }) {
  const unhashed = { id: id ?? ulid(), run_id: runId, agent, seq, type, schema_version: 1, ts: ts ?? utcNow(), payload, prev_hash: prevHash };
  const hash = createHash("sha256").update(prevHash, "ascii").update(canonicalize(unhashed), "utf8").digest("hex");
  const event = { ...unhashed, hash };
  return { event, data: Buffer.from(canonicalize(event), "utf8") };
}

/** The single writer of one chain (a run, or a key): seq, prev_hash and the fence of the next append. */
export class ChainWriter {
  constructor(js, subject, { runId, agent, msgId, seq = 0, prevHash = GENESIS, lastStreamSeq = 0 }) {
    Object.assign(this, { js, subject, runId, agent, msgId, seq, prevHash, lastStreamSeq });
  }

  async append(type, payload, { ts, id } = {}) {
    const { event, data } = makeEvent({ id, runId: this.runId, agent: this.agent, seq: this.seq, type, payload, prevHash: this.prevHash, ts });
    const { headers } = await import("nats");
    const h = headers();
    h.set("Nats-Msg-Id", this.msgId(this.seq));
    h.set(FENCE, String(this.lastStreamSeq));
    h.set(FENCE_SUBJECT, fenceFor(this.subject, this.lastStreamSeq));
    let ack;
    try {
      ack = await this.js.publish(this.subject, data, { headers: h, timeout: 5000 });
    } catch (err) {
      const code = err?.api_error?.err_code;
      if (code === WRONG_LAST_SEQUENCE) {
        const fenced = new Error(`fenced on ${this.subject}: ${err.api_error.description}`);
        fenced.fenced = true;
        throw fenced;
      }
      throw err;
    }
    this.lastStreamSeq = ack.seq;
    this.seq += 1;
    this.prevHash = event.hash;
    return { event, streamSeq: ack.seq };
  }
}

// -- a complete run ----------------------------------------------------------------------------

async function writeRun({ server, agent, runId, key }) {
  const { connect } = await import("nats");
  const nc = await connect({ servers: server });
  const js = nc.jetstream();
  const run = new ChainWriter(js, runSubject(agent, runId), { runId, agent, msgId: (s) => runMsgId(runId, s) });
  const prompt = "You issue refunds.";
  await run.append("run.started", {
    agent,
    version: { agent_version: "node-publisher-0.1.0", model: "scripted", prompt_hash: sha256hex(Buffer.from(prompt, "utf8")), tool_schema_hashes: {} },
    budgets: { turns: null, tokens: null, seconds: null },
    input: { order: key.split(":").pop(), amount: 12.5 },
    capture: "full",
    labels: { client: "node" },
    chain_format: 2,
  });
  const messages = [{ role: "user", content: "refund it" }];
  const params = { temperature: 0 };
  await run.append("model.called", {
    step: 0, model: "scripted", request: { messages, params }, args_digest: digest({ messages, params }),
    response: { content: "refunding", tool_calls: [], finish_reason: "stop" },
    usage: { input_tokens: 9, output_tokens: 2 }, duration_ms: 1.5, attempt: 1, will_retry: false,
  });
  const lookup = { order: key.split(":").pop() };
  await run.append("tool.called", {
    step: 1, name: "lookup_order", args: lookup, args_digest: digest(lookup),
    output: { amount: 12.5, currency: "EUR" }, duration_ms: 0.25, attempt: 1, will_retry: false,
  });
  // The effect: intent on the run, claim on the key (fenced on "the key is empty"), act, outcome on
  // the key (fenced on the claim), outcome on the run.
  const args = { order: key.split(":").pop(), amount: 12.5 };
  const intent = { step: 2, name: "refund", key, args, args_digest: digest(args), effect_class: "irreversible", lease_s: 30, tool_call_id: null, holder: null };
  await run.append("effect.intended", intent);
  const keyWriter = new ChainWriter(js, keySubject(agent, key), { runId, agent, msgId: (s) => keyMsgId(agent, key, s) });
  let claim;
  try {
    claim = await keyWriter.append("effect.intended", intent);
  } catch (err) {
    if (!err.fenced) throw err;
    // The key has a history: a real publisher reads it and settles it (docs/wire.md); this one stops.
    await nc.close();
    process.stdout.write(JSON.stringify({ run_id: runId, claimed: false }) + "\n");
    process.exit(3);
  }
  const result = { refund_id: `rf-${claim.streamSeq}`, amount: 12.5 };
  const committed = { step: 2, key, result, duration_ms: 2, via: "act", fencing_token: claim.streamSeq };
  const onKey = await keyWriter.append("effect.committed", committed);
  await run.append("effect.committed", committed);
  const done = await run.append("run.completed", { output: { refunded: 12.5 } });
  await nc.drain();
  process.stdout.write(JSON.stringify({
    run_id: runId, claimed: true, subject: run.subject, key_subject: keyWriter.subject,
    fencing_token: claim.streamSeq, key_last_stream_seq: onKey.streamSeq, run_last_stream_seq: done.streamSeq,
    events: run.seq, last_hash: run.prevHash,
  }) + "\n");
}

// -- the vectors -------------------------------------------------------------------------------

function checkVectors(dir) {
  const failures = [];
  let checked = 0;
  let skipped = 0;
  const canonical = JSON.parse(readFileSync(join(dir, "canonical.json"), "utf8"));
  for (const c of canonical.cases) {
    let value;
    if (c.ieee754) value = Buffer.from(c.ieee754, "hex").readDoubleBE(0);
    else {
      value = JSON.parse(c.input);
      // JSON.parse reads numbers as doubles: a case beyond 2**53 cannot be held (the integer extension)
      if (/\d{16,}/.test(c.input) && canonicalize(value) !== c.canonical) { skipped++; continue; }
    }
    const text = canonicalize(value);
    checked++;
    if (text !== c.canonical) failures.push(`${c.name}: ${text} != ${c.canonical}`);
    else if (sha256hex(Buffer.from(text, "utf8")) !== c.sha256) failures.push(`${c.name}: sha256`);
  }
  for (const k of canonical.keys) if (keyToken(k.key) !== k.subject_token) failures.push(`key ${k.key}`);
  const runs = JSON.parse(readFileSync(join(dir, "runs.json"), "utf8"));
  const chains = new Map();
  const last = new Map();
  for (const m of runs.messages) {
    checked++;
    const event = JSON.parse(m.data);
    const { hash, ...unhashed } = event;
    const fence = fenceFilter(m.subject);
    const [seq, prev] = chains.get(fence) ?? [0, GENESIS];
    const ours = makeEvent({ id: event.id, runId: event.run_id, agent: event.agent, seq, type: event.type, payload: event.payload, prevHash: prev, ts: event.ts });
    const isKey = m.subject.startsWith("ledger.effect.");
    const subject = isKey ? keySubject(event.agent, event.payload.key, m.subject.slice(-1)) : runSubject(event.agent, event.run_id, m.subject.slice(-1));
    const msgId = isKey ? keyMsgId(event.agent, event.payload.key, seq) : runMsgId(event.run_id, seq);
    const problems = [];
    if (ours.data.toString("utf8") !== m.data) problems.push("bytes");
    if (ours.event.hash !== hash || hash !== m.hash || unhashed.prev_hash !== prev) problems.push("hash chain");
    if (subject !== m.subject) problems.push(`subject ${subject}`);
    if (m.headers["Nats-Msg-Id"] !== msgId) problems.push(`msg id ${msgId}`);
    if (m.headers[FENCE] !== String(last.get(fence) ?? 0) || m.headers[FENCE_SUBJECT] !== fenceFor(m.subject, last.get(fence) ?? 0)) problems.push("fence");
    if ("args_digest" in event.payload && "args" in event.payload && digest(event.payload.args) !== event.payload.args_digest) problems.push("args_digest");
    if (problems.length) failures.push(`message ${m.stream_seq}: ${problems.join(", ")}`);
    chains.set(fence, [seq + 1, hash]);
    last.set(fence, m.stream_seq);
  }
  const digests = JSON.parse(readFileSync(join(dir, "digests.json"), "utf8"));
  const key = digestKey(Buffer.from(digests.data_key, "base64"));
  checked++;
  if (key.toString("base64") !== digests.digest_key) failures.push("digest key");
  for (const c of digests.cases) {
    checked++;
    if (canonicalize(c.value) !== c.canonical || digest(c.value) !== c.plain || keyedDigest(key, c.value) !== c.keyed) failures.push(`digests: ${c.name}`);
  }
  process.stdout.write(JSON.stringify({ checked, skipped, failures }) + "\n");
  process.exit(failures.length ? 1 : 0);
}

// -- command line ------------------------------------------------------------------------------

function parseArgs(argv) {
  const out = {};
  for (let i = 0; i < argv.length; i += 2) {
    if (!argv[i].startsWith("--")) throw new Error(`unexpected ${argv[i]}`);
    out[argv[i].slice(2).replace(/-([a-z])/g, (_, c) => c.toUpperCase())] = argv[i + 1];
  }
  return out;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const opts = parseArgs(process.argv.slice(2));
  if (opts.checkVectors) checkVectors(opts.checkVectors);
  else {
    for (const need of ["server", "agent", "key"]) if (!opts[need]) throw new Error(`--${need} is required`);
    await writeRun({ server: opts.server, agent: opts.agent, runId: opts.runId ?? ulid(), key: opts.key });
  }
}
