"""An E2B user's commands, unchanged: output callbacks, a failing command, background processes
(list, kill, connect), stdin, environment variables and the working directory."""

from e2b import CommandExitException, Sandbox

with Sandbox.create(envs={"GREETING": "hi from create"}) as sbx:
    printed = []
    result = sbx.commands.run("echo $GREETING; echo warning >&2", on_stdout=printed.append)
    assert (result.stdout, result.stderr, result.exit_code) == ("hi from create\n", "warning\n", 0), result
    assert "".join(printed) == "hi from create\n", printed
    assert sbx.commands.run("echo $ONE", envs={"ONE": "per command"}).stdout == "per command\n"

    try:
        sbx.commands.run("echo about to fail; exit 3")
        raise AssertionError("a non-zero exit must raise")
    except CommandExitException as failed:
        assert failed.exit_code == 3 and failed.stdout == "about to fail\n", failed

    sbx.files.write("/home/user/work/input.txt", "from the files API\n")
    assert sbx.commands.run("cat input.txt", cwd="/home/user/work").stdout == "from the files API\n"

    sleeper = sbx.commands.run("sleep 600", background=True)
    assert sleeper.pid in [p.pid for p in sbx.commands.list()]
    watcher = sbx.commands.connect(sleeper.pid)
    assert sbx.commands.kill(sleeper.pid)
    try:
        watcher.wait()
        raise AssertionError("a killed command must not look successful")
    except CommandExitException as killed:
        assert killed.exit_code != 0
    assert sleeper.pid not in [p.pid for p in sbx.commands.list()]
    assert not sbx.commands.kill(sleeper.pid)  # already gone

    cat = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.send_stdin(cat.pid, "typed in\n")
    sbx.commands.close_stdin(cat.pid)
    assert cat.wait().stdout == "typed in\n"

    streamed = []
    sbx.commands.run("for i in 1 2 3; do echo line $i; sleep 0.2; done", on_stdout=streamed.append)
    assert "".join(streamed) == "line 1\nline 2\nline 3\n", streamed
    print("commands ok")
