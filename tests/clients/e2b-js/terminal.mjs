// An E2B user's terminal and server on E2B's JavaScript SDK, unchanged: a shell on a pty (typed
// input, the terminal's size, exit), and a guest HTTP server reached as getHost names it:
// {port}-{id}.{E2B_DOMAIN}. Where no DNS answers for the domain (here), the request goes to
// FORKD_TEST_PORT_PROXY with that Host header, as a wildcard record pointing there would send it.
import assert from 'node:assert/strict'
import http from 'node:http'
import { Sandbox } from 'e2b'

const template = process.argv[2] ?? 'base'
const sbx = await Sandbox.create(template, { timeoutMs: 600_000 })
try {
  // A pty: a shell whose output streams to onData, typed input, the size it was given, exit.
  const chunks = []
  const seen = () => Buffer.concat(chunks).toString()
  const until = async (text) => {
    for (const deadline = Date.now() + 60_000; Date.now() < deadline;) {
      if (seen().includes(text)) return
      await new Promise((r) => setTimeout(r, 100))
    }
    throw new Error(`${text} never came: ${seen()}`)
  }
  const term = await sbx.pty.create({ cols: 80, rows: 24, envs: { GREETING: 'hello' }, cwd: '/tmp',
    onData: (d) => chunks.push(Buffer.from(d)) })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('echo $GREETING-$(whoami)-$(pwd); tty; stty size\n'))
  await until('hello-user-/tmp')
  await until('/dev/pts/')
  await until('24 80')
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('exit\n'))
  assert.equal((await term.wait()).exitCode, 0)

  // getHost: a guest server on port 8000, through {port}-{id}.{domain}.
  await sbx.files.write('/tmp/www/hello.txt', 'hello through getHost\n')
  await sbx.commands.run('cd /tmp/www && python3 -m http.server 8000', { background: true })
  const host = sbx.getHost(8000)
  assert.equal(host, `8000-${sbx.sandboxId}.${process.env.E2B_DOMAIN}`)
  const get = () => new Promise((resolve, reject) => {
    http.get(`${process.env.FORKD_TEST_PORT_PROXY}/hello.txt`, { headers: { Host: host } }, (res) => {
      const body = []
      res.on('data', (c) => body.push(c))
      res.on('end', () => resolve([res.statusCode, Buffer.concat(body).toString()]))
    }).on('error', reject)
  })
  let status, body
  for (const deadline = Date.now() + 60_000; ;) { // until the server listens (502 before)
    [status, body] = await get()
    if (status !== 502 || Date.now() > deadline) break
    await new Promise((r) => setTimeout(r, 300))
  }
  assert.equal(status, 200, body.slice(0, 300))
  assert.equal(body, 'hello through getHost\n')
} finally {
  await sbx.kill()
}
console.log('terminal ok')
