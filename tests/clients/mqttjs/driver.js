'use strict'
// MQTT.js (the npm package mqtt, pinned in package.json) driven by tests/integration/test_interop_clients.py.
// One process is one client. Its scenario comes on stdin, one JSON command a line, run as it
// arrives: {"op": "connect" | "subscribe" | "publish" | "end" | "drop", ...}. What the client sees is
// printed on stdout, one JSON event a line: connect (session present, reason code, properties),
// message (topic, payload, qos, retain, dup, packet id, properties), suback, published (the
// ack's reason code), disconnect (the broker's DISCONNECT reason code), close, error.
// Buffers (payloads, correlation data) travel as {"hex": "..."}; a string payload is UTF-8.
const readline = require('readline')
const mqtt = require('mqtt')

function plain (v) {
  if (Buffer.isBuffer(v)) return { hex: v.toString('hex') }
  if (Array.isArray(v)) return v.map(plain)
  if (v && typeof v === 'object') {
    const o = {}
    for (const [k, x] of Object.entries(v)) o[k] = plain(x)
    return o
  }
  return v
}

function out (event) {
  process.stdout.write(JSON.stringify(plain(event)) + '\n')
}

function buf (v) {
  if (v && typeof v === 'object' && typeof v.hex === 'string') return Buffer.from(v.hex, 'hex')
  return Buffer.from(v == null ? '' : String(v), 'utf8')
}

function props (p) {
  if (!p) return undefined
  const o = { ...p }
  if (o.correlationData !== undefined) o.correlationData = buf(o.correlationData)
  return o
}

let client = null

const ops = {
  connect (c) {
    const opts = {
      protocolVersion: c.protocolVersion || 5,
      clientId: c.clientId,
      clean: c.clean !== false,
      reconnectPeriod: 0, // the test decides when a client comes back
      keepalive: 30,
      connectTimeout: 10000,
      properties: c.properties,
      autoUseTopicAlias: !!c.autoUseTopicAlias,
      autoAssignTopicAlias: !!c.autoAssignTopicAlias
    }
    if (c.will) {
      opts.will = {
        topic: c.will.topic,
        payload: buf(c.will.payload),
        qos: c.will.qos || 0,
        retain: !!c.will.retain,
        properties: props(c.will.properties)
      }
    }
    client = mqtt.connect(`mqtt://127.0.0.1:${c.port}`, opts)
    client.on('connect', (p) => out({
      event: 'connect',
      sessionPresent: p.sessionPresent,
      reasonCode: p.reasonCode !== undefined ? p.reasonCode : p.returnCode,
      properties: p.properties
    }))
    client.on('message', (topic, payload, p) => out({
      event: 'message',
      topic,
      payload,
      qos: p.qos,
      retain: p.retain,
      dup: p.dup,
      messageId: p.messageId,
      properties: p.properties || {}
    }))
    client.on('disconnect', (p) => out({ event: 'disconnect', reasonCode: p.reasonCode, properties: p.properties }))
    client.on('close', () => out({ event: 'close' }))
    client.on('error', (e) => out({ event: 'error', message: e.message, code: e.code }))
  },
  subscribe (c) {
    client.subscribe(c.topic, { qos: c.qos || 0 }, (err, granted) => out({
      event: 'suback',
      id: c.id,
      error: err ? err.message : null,
      granted: (granted || []).map((g) => g.qos)
    }))
  },
  publish (c) {
    const opts = { qos: c.qos || 0, retain: !!c.retain, properties: props(c.properties) }
    client.publish(c.topic, buf(c.payload), opts, (err, packet) => out({
      event: 'published',
      id: c.id,
      error: err ? err.message : null,
      reasonCode: packet ? packet.reasonCode : undefined
    }))
  },
  end (c) { // a normal DISCONNECT
    client.end(false, {}, () => out({ event: 'ended', id: c.id }))
  },
  drop () { // the TCP connection closes without DISCONNECT
    client.stream.destroy()
  }
}

const rl = readline.createInterface({ input: process.stdin })
rl.on('line', (line) => {
  if (!line.trim()) return
  const c = JSON.parse(line)
  try {
    ops[c.op](c)
  } catch (e) {
    out({ event: 'error', id: c.id, message: String(e) })
  }
})
rl.on('close', () => {
  if (client) client.end(true)
  process.exit(0)
})
