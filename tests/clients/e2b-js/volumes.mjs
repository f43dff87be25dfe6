// An E2B user's volumes on E2B's JavaScript SDK, unchanged: create one, put a file in it from
// outside, mount it in two sandboxes, and each sees what the other writes; then the files from
// outside again, and the volume destroyed once no sandbox uses it. Needs E2B_VOLUME_API_URL (the
// daemon) beside E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY.
import assert from 'node:assert/strict'
import { Sandbox, Volume, VolumeError } from 'e2b'

const NAME = 'compat-vol-js'
const vol = await Volume.create(NAME)
assert.equal(vol.volumeId, NAME)
assert.ok(vol.token, 'a volume comes with its token')
assert.ok((await Volume.list()).some((v) => v.name === NAME))
await vol.writeFile('/seed.txt', 'from outside\n')
const stat = await vol.getInfo('/seed.txt')
assert.equal(stat.size, 'from outside\n'.length)

const a = await Sandbox.create({ timeoutMs: 600_000, volumeMounts: { '/mnt/shared': vol } })
const b = await Sandbox.create({ timeoutMs: 600_000, volumeMounts: { '/mnt/shared': NAME } }) // by name
assert.equal(await b.files.read('/mnt/shared/seed.txt'), 'from outside\n')
assert.deepEqual((await a.getInfo()).volumeMounts, [{ name: NAME, path: '/mnt/shared' }])

await a.commands.run("echo 'from a' > /mnt/shared/a.txt")
const deadline = Date.now() + 10_000
while (!(await b.files.exists('/mnt/shared/a.txt')) && Date.now() < deadline) {
  await new Promise((resolve) => setTimeout(resolve, 100))
}
assert.equal(await b.files.read('/mnt/shared/a.txt'), 'from a\n')
await b.commands.run("echo 'from b' >> /mnt/shared/a.txt")
assert.equal(await a.files.read('/mnt/shared/a.txt'), 'from a\nfrom b\n')
assert.equal(await vol.readFile('/a.txt'), 'from a\nfrom b\n') // the content API sees their writes
assert.deepEqual((await vol.list('/')).map((e) => e.name).sort(), ['a.txt', 'seed.txt'])

// Not destroyed while two sandboxes mount it.
await assert.rejects(Volume.destroy(NAME), (e) => e instanceof VolumeError || /409/.test(String(e)))
for (const sbx of [a, b]) await sbx.kill()
assert.equal(await Volume.destroy(NAME), true)
assert.ok(!(await Volume.list()).some((v) => v.name === NAME))
console.log('volumes ok')
