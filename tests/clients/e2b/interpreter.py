"""An E2B user's code interpreter session, unchanged: state across calls, stdout, errors,
environment variables, a second context."""

import threading
import time

from e2b_code_interpreter import Sandbox, TimeoutException

with Sandbox.create(envs={"GREETING": "hello from the host"}) as sbx:
    first = sbx.run_code("x = 1")
    assert first.error is None
    second = sbx.run_code("x + 1")
    assert second.text == "2", second

    printed = []
    execution = sbx.run_code("print('counting', x)\nx * 10", on_stdout=lambda m: printed.append(m.line))
    assert execution.logs.stdout == ["counting 1\n"], execution.logs
    assert printed == ["counting 1\n"] and execution.text == "10"

    env = sbx.run_code("import os\nos.environ['GREETING']")
    assert env.text == "'hello from the host'", env

    failed = sbx.run_code("def broken():\n    return {}['missing']\nbroken()")
    assert failed.error is not None and failed.error.name == "KeyError", failed.error
    assert "broken" in failed.error.traceback
    assert sbx.run_code("x").text == "1"  # the error did not lose the state

    ctx = sbx.create_code_context()
    assert sbx.run_code("x", context=ctx).error.name == "NameError"
    assert sbx.run_code("y = 5\ny", context=ctx).text == "5"
    assert ctx.id in [c.id for c in sbx.list_code_contexts()]
    sbx.remove_code_context(ctx)

# Killed while run_code runs: once its stream breaks, the SDK asks /health, which answers "not
# found" from the moment the kill begins, so it says the sandbox was killed (not a raw
# httpx.RemoteProtocolError, as when /health still answered during the teardown).
with Sandbox.create() as doomed:
    outcome: list[BaseException | None] = []

    def long_cell() -> None:
        try:
            doomed.run_code("open('/tmp/started', 'w').close()\nimport time\ntime.sleep(120)")
            outcome.append(None)
        except BaseException as exc:  # what the SDK raised is the finding
            outcome.append(exc)

    worker = threading.Thread(target=long_cell)
    worker.start()
    deadline = time.monotonic() + 60
    while not doomed.files.exists("/tmp/started"):
        assert time.monotonic() < deadline, "the cell did not start"
        time.sleep(0.1)
    doomed.kill()
    worker.join(60)
    [raised] = outcome
    assert isinstance(raised, TimeoutException) and "was killed" in str(raised), repr(raised)
print("interpreter ok")
