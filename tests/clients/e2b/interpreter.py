"""An E2B user's code interpreter session, unchanged: state across calls, stdout, errors,
environment variables, a second context."""

from e2b_code_interpreter import Sandbox

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
    print("interpreter ok")
