// Processes, evals and networking through the SDK, against a real daemon with real VMs
// (FORKD_URL, FORKD_TOKEN; the snapshot FORKD_TEST_TAG, default "pyagent", and
// FORKD_TEST_NET_TAG, a snapshot made with a NIC; FORKD_TEST_CODE_TAG, a snapshot of the
// code-interpreter image, for the cells on a Jupyter kernel). One sandbox serves the process
// tests; every test kills what it made.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";

import {
  BadRequestError,
  CommandHandle,
  ConflictError,
  Controller,
  NotFoundError,
  Result,
  Sandbox,
  signalName,
  type ExecutionError,
  type ProcessEvent,
} from "@deeplethe/forkd";

const TAG = process.env.FORKD_TEST_TAG ?? "pyagent";
const NET_TAG = process.env.FORKD_TEST_NET_TAG;
const CODE_TAG = process.env.FORKD_TEST_CODE_TAG;
const ctrl = new Controller();
let sb: Sandbox;

before(async () => {
  sb = await Sandbox.create(TAG, { controller: ctrl, metadata: { suite: "ts-processes" } });
});

after(async () => {
  await sb?.close();
});

// The guest's eth0 address, read with an ioctl (the guest has no iproute2).
const ETH0_ADDR = [
  "import fcntl, socket, struct",
  "_s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)",
  'socket.inet_ntoa(fcntl.ioctl(_s.fileno(), 0x8915, struct.pack("256s", b"eth0"))[20:24])',
].join("\n");

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe("streaming exec", () => {
  test("a line printed before a sleep arrives while the command still runs", async () => {
    const stream = await ctrl.execStream(sb.id, "echo first; sleep 3; echo second >&2");
    const events: ProcessEvent[] = [];
    let pid = 0;
    let runningWhenFirstArrived: boolean | undefined;
    for await (const event of stream) {
      events.push(event);
      if (event.type === "start") pid = event.pid;
      if (event.type === "stdout" && event.data === "first\n") {
        // The daemon's own view at that moment: the command has not ended.
        runningWhenFirstArrived = (await ctrl.getProcess(sb.id, pid)).running;
      }
    }
    assert.equal(runningWhenFirstArrived, true);
    assert.deepEqual(events.map((e) => e.type), ["start", "stdout", "stderr", "exit"]);
    const exit = events.at(-1)!;
    assert.ok(exit.type === "exit");
    assert.deepEqual([exit.pid, exit.exit_code, exit.timed_out], [pid, 0, false]);
  });

  test("commands.run streams to onStdout/onStderr as the command writes", async () => {
    const seen: string[] = [];
    const result = await sb.commands.run("echo one; read line; echo got $line; echo err >&2; exit 5", {
      stdinOpen: true,
      tag: "interactive",
      onStdout: async (data) => {
        seen.push(`out:${data}`);
        // The command waits for this line of input: only a stream can see "one" before it ends.
        if (data === "one\n") {
          const [proc] = (await sb.commands.list()).filter((p) => p.tag === "interactive");
          await sb.commands.sendStdin(proc!.pid, "two\n");
        }
      },
      onStderr: (data) => {
        seen.push(`err:${data}`);
      },
    });
    assert.deepEqual(seen, ["out:one\n", "out:got two\n", "err:err\n"]);
    assert.deepEqual([result.stdout, result.stderr, result.exit_code], ["one\ngot two\n", "err\n", 5]);
  });

  test("leaving the loop early kills the command", async () => {
    const stream = await ctrl.execStream(sb.id, ["sh", "-c", "echo ready; sleep 300"], { tag: "left-early" });
    let pid = 0;
    for await (const event of stream) {
      if (event.type === "start") pid = event.pid;
      if (event.type === "stdout") break;
    }
    for (let i = 0; (await ctrl.getProcess(sb.id, pid)).running; i++) {
      assert.ok(i < 100, "the command outlived its stream by 20 s");
      await sleep(200);
    }
    const info = await ctrl.getProcess(sb.id, pid);
    assert.equal(info.exit_code, -9);
  });

  test("base64 output carries the exact bytes", async () => {
    const stream = await ctrl.execStream(sb.id, ["python3", "-c", "import sys; sys.stdout.buffer.write(bytes([0, 255, 10]))"], {
      encoding: "base64",
    });
    const chunks: Buffer[] = [];
    for await (const event of stream) if (event.type === "stdout") chunks.push(Buffer.from(event.data, "base64"));
    assert.deepEqual([...Buffer.concat(chunks)], [0, 255, 10]);
  });
});

describe("background processes", () => {
  test("start, list, attach from the start, kill", async () => {
    const handle = await sb.commands.run("echo started; sleep 300", { background: true, tag: "bg-kill", timeoutSecs: 0 });
    assert.ok(handle instanceof CommandHandle);
    const listed = await sb.commands.list();
    assert.deepEqual(listed.filter((p) => p.tag === "bg-kill").map((p) => p.pid), [handle.pid]);

    // A second handle on the same process sees the output written before it looked.
    const attached = await sb.commands.connect(handle.pid);
    for await (const chunk of attached) {
      if (chunk.stdout) {
        assert.equal(chunk.stdout, "started\n");
        break;
      }
    }
    assert.equal(await handle.kill(), true);
    const result = await handle.wait();
    assert.equal(result.exit_code, -9);
    assert.equal(handle.exitCode, -9);
    assert.equal(result.stdout, "started\n");
    assert.equal(await handle.kill(), false);
    assert.ok(!(await sb.commands.list()).some((p) => p.pid === handle.pid));
    const gone = await sb.commands.connect(999_999).catch((e: unknown) => e);
    assert.ok(gone instanceof NotFoundError);
  });

  test("stdin: text and bytes, then end-of-file", async () => {
    const script = "import sys\nfor line in sys.stdin: print(line.strip().upper(), flush=True)\nprint('eof')";
    const handle = await sb.commands.run(["python3", "-c", script], { background: true, stdinOpen: true });
    await handle.sendStdin("abc\n");
    await handle.sendStdin(new TextEncoder().encode("déf\n"));
    await handle.closeStdin();
    const result = await handle.wait();
    assert.deepEqual([result.stdout, result.exit_code], ["ABC\nDÉF\neof\n", 0]);
    const closed = await ctrl.sendStdin(sb.id, handle.pid, "late").catch((e: unknown) => e);
    assert.ok(closed instanceof ConflictError || closed instanceof NotFoundError, String(closed));
  });

  test("a signal reaches the process's trap", async () => {
    const onStdout: string[] = [];
    const handle = await sb.commands.run("trap 'echo term; exit 7' TERM; echo ready; while :; do sleep 0.1; done", {
      background: true,
      onStdout: (d) => {
        onStdout.push(d);
      },
    });
    for await (const chunk of handle) if (chunk.stdout?.includes("ready")) break;
    await handle.signal("term");
    const result = await handle.wait();
    assert.equal(result.exit_code, 7);
    assert.match(result.stdout, /ready\nterm\n/);
    assert.match(onStdout.join(""), /term/);
    assert.equal(signalName(9), "SIGKILL");
    assert.equal(signalName("int"), "SIGINT");
  });
});

describe("evals", () => {
  test("timeoutSecs interrupts an eval; cancelEval interrupts another", async () => {
    const timedOut = await sb.eval("while True: pass", { timeoutSecs: 1 });
    assert.equal(timedOut.result, null);
    assert.match(timedOut.error ?? "", /TimeoutError/);

    const running = sb.eval("while True: pass", { timeoutSecs: 120 });
    let cancelled = false;
    for (let i = 0; !cancelled; i++) {
      assert.ok(i < 100, "the eval never started");
      await sleep(100);
      cancelled = await sb.cancelEval();
    }
    const answer = await running;
    assert.match(answer.error ?? "", /CancelledError: eval cancelled/);
    assert.equal(await sb.cancelEval(), false);
    assert.equal((await sb.eval("6 * 7")).result, "42");
  });
});

describe("networking", () => {
  test("egress options on a snapshot without a NIC are refused, naming the fix", async () => {
    const err = await ctrl.spawnSandboxes({ snapshotTag: TAG, allowInternetAccess: true }).catch((e: unknown) => e);
    assert.ok(err instanceof BadRequestError);
    assert.match(err.message, /"nic": true/);
    const noIp = await sb.getHost(8000).catch((e: unknown) => e);
    assert.match(String(noIp), /no network address/);
  });

  test("a sandbox with a NIC has an ip, and its egress policy as asked", { skip: !NET_TAG && "FORKD_TEST_NET_TAG is not set" }, async () => {
    const net = await Sandbox.create(NET_TAG!, {
      controller: ctrl,
      network: { allowOut: ["10.201.0.1:8080"], denyOut: ["192.0.2.0/24"] },
    });
    try {
      const info = await net.info();
      assert.match(info.ip ?? "", /^\d+\.\d+\.\d+\.\d+$/);
      assert.equal(info.network?.allow_internet_access, false);
      assert.deepEqual(info.network?.allow_out, ["10.201.0.1:8080"]);
      assert.deepEqual(info.network?.deny_out, ["192.0.2.0/24"]);
      assert.equal(await net.getHost(8000), `${info.ip}:8000`);
      // The guest's eth0 has the address the info gives.
      const eth0 = await net.eval(ETH0_ADDR);
      assert.equal(eth0.result, `'${info.network?.guest_ip}'`);
    } finally {
      await net.close();
    }
  });
});

describe("code cells", () => {
  test("runCode on a sandbox without a Jupyter kernel (the default image) rejects with a ConflictError",
    { skip: TAG !== "pyagent" && "FORKD_TEST_TAG is not the default image" }, async () => {
      await assert.rejects(sb.runCode("print(6*7)\n6*7"), (err: unknown) =>
        err instanceof ConflictError && /no Jupyter kernel/.test(err.message));
    });

  test("runCode: stdout and text as callbacks and fields, a PNG result, an error's name",
    { skip: !CODE_TAG && "set FORKD_TEST_CODE_TAG to a snapshot of the code-interpreter image" }, async () => {
      const cells = await Sandbox.create(CODE_TAG!, { controller: ctrl });
      try {
        const out: string[] = [];
        const execution = await cells.runCode("print(6*7)\n6*7", { onStdout: (text) => { out.push(text); } });
        assert.deepEqual(out, ["42\n"]);
        assert.deepEqual(execution.logs, { stdout: ["42\n"], stderr: [] });
        assert.equal(execution.text, "42");
        assert.equal(execution.error, undefined);
        const results: Result[] = [];
        const figure = await cells.runCode(
          "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 1, 9])\nplt.show()",
          { onResult: (r) => { results.push(r); } });
        assert.equal(results.length, 1);
        assert.equal(figure.results[0], results[0]);
        assert.equal(results[0].isMainResult, false);
        assert.deepEqual([...Buffer.from(results[0].png ?? "", "base64").subarray(0, 8)],
          [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
        const errors: ExecutionError[] = [];
        const failed = await cells.runCode("1 / 0", { onError: (e) => { errors.push(e); } });
        assert.equal(failed.error?.name, "ZeroDivisionError");
        assert.deepEqual(errors, [failed.error]);
        // Another language's kernel, by name.
        const bash = await cells.runCode("echo hi-$((6*7))", { language: "bash" });
        assert.deepEqual(bash.logs.stdout.join(""), "hi-42\n");
      } finally {
        await cells.close();
      }
    });
});

describe("terminal", () => {
  test("a shell on a pty: keys in, output out, a resize, its exit code", async () => {
    const chunks: Uint8Array[] = [];
    const term = await sb.terminal({ cols: 90, rows: 20, onData: (d) => chunks.push(d) });
    const text = () => Buffer.concat(chunks).toString("utf8");
    term.send("stty size; echo hi-$((6*7))\n");
    for (let i = 0; i < 300 && !/hi-42/.test(text()); i++) await sleep(100);
    assert.match(text(), /20 90/);
    term.resize(120, 40);
    term.send("stty size; exit 4\n");
    assert.equal(await term.exited, 4);
    assert.match(text(), /40 120/);
  });
});
