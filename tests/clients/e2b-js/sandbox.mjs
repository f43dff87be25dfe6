// An E2B user's program on E2B's JavaScript SDK, unchanged: only E2B_API_URL, E2B_SANDBOX_URL
// and E2B_API_KEY point it at forkd. Create, commands with streamed output and a background
// one, files, pause and connect, fork, kill.
import assert from 'node:assert/strict'
import { CommandExitError, Sandbox } from 'e2b'

const sbx = await Sandbox.create({ timeoutMs: 600_000 })

// Streamed output arrives in order, chunk by chunk, while the command runs.
const chunks = []
const run = await sbx.commands.run('for i in 1 2 3; do echo line$i; sleep 0.3; done; echo oops >&2', {
  onStdout: (data) => chunks.push([Date.now(), data]),
})
assert.equal(run.exitCode, 0)
assert.equal(run.stdout, 'line1\nline2\nline3\n')
assert.equal(run.stderr, 'oops\n')
assert.deepEqual(chunks.map(([, d]) => d).join(''), run.stdout)
assert.ok(chunks.length >= 2 && chunks.at(-1)[0] - chunks[0][0] >= 300, 'output came at the end only')

// As E2B runs it: the user `user`, in its home; root on request.
assert.equal((await sbx.commands.run('whoami && pwd')).stdout, 'user\n/home/user\n')
assert.equal((await sbx.commands.run('whoami', { user: 'root' })).stdout, 'root\n')
await assert.rejects(sbx.commands.run('exit 3'), (e) => e instanceof CommandExitError && e.exitCode === 3)

// A background command, listed, then killed.
const bg = await sbx.commands.run('sleep 300', { background: true })
assert.ok((await sbx.commands.list()).some((p) => p.pid === bg.pid))
assert.equal(await sbx.commands.kill(bg.pid), true)

// Files: write, read, list, stat.
await sbx.files.write('/home/user/notes/a.txt', 'hello from js')
assert.equal(await sbx.files.read('/home/user/notes/a.txt'), 'hello from js')
const listed = await sbx.files.list('/home/user/notes')
assert.deepEqual(listed.map((e) => e.name), ['a.txt'])
const info = await sbx.files.getInfo('/home/user/notes/a.txt')
assert.equal(info.size, 13)
assert.equal(info.owner, 'user')

// Pause, then connect resumes it with its files and its memory (a process still running).
const keeper = await sbx.commands.run('sleep 600', { background: true })
await sbx.pause()
assert.equal(await sbx.isRunning(), false)
const same = await Sandbox.connect(sbx.sandboxId)
assert.equal(await same.files.read('/home/user/notes/a.txt'), 'hello from js')
assert.ok((await same.commands.list()).some((p) => p.pid === keeper.pid), 'the process did not survive')

// Fork: two children from its running state, each its own from then on.
const forks = await same.fork({ count: 2, timeoutMs: 600_000 })
assert.equal(forks.length, 2)
for (const [i, child] of forks.entries()) {
  assert.ok(!(child instanceof Error), String(child))
  assert.notEqual(child.sandboxId, same.sandboxId)
  assert.equal(await child.files.read('/home/user/notes/a.txt'), 'hello from js')
  await child.files.write('/home/user/notes/a.txt', `child ${i}`)
}
assert.equal(await forks[0].files.read('/home/user/notes/a.txt'), 'child 0')
assert.equal(await same.files.read('/home/user/notes/a.txt'), 'hello from js')

for (const s of [...forks, same]) await s.kill()
assert.equal(await same.isRunning(), false)
console.log('sandbox ok')
