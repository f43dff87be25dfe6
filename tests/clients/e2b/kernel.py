"""An E2B user's code interpreter session on the code-interpreter image, unchanged: a chart as a
PNG and as chart data, a DataFrame as HTML, output that streams, an interrupted cell, a context, the
sandbox's envs, and bash and JavaScript cells."""

import base64
import time

from e2b.exceptions import TimeoutException
from e2b_code_interpreter import Sandbox
from e2b_code_interpreter.charts import BarChart, LineChart

with Sandbox.create(envs={"GREETING": "hello from the host"}) as sbx:
    chart = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.show()")
    pngs = [r.png for r in chart.results if r.png]
    assert chart.error is None and len(pngs) == 1, chart
    assert base64.b64decode(pngs[0])[:8] == b"\x89PNG\r\n\x1a\n"
    line = chart.results[0].chart  # the SDK's own chart classes, from the e2b/chart MIME type
    assert isinstance(line, LineChart) and line.elements[0].points == [(1, 3), (2, 1), (3, 2)], chart
    bars = sbx.run_code("plt.bar(['a', 'b'], [4, 2])\nplt.show()").results[0].chart
    assert isinstance(bars, BarChart) and [(b.label, b.value) for b in bars.elements] == [("a", 4), ("b", 2)]

    frame = sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
    assert frame.results[0].is_main_result and "<table" in frame.results[0].html, frame
    assert sbx.run_code("'/'").text == "/"  # a string result without its quotes, as E2B sends it

    seen = []
    sbx.run_code("import time\nprint('a', flush=True)\ntime.sleep(2)\nprint('b')",
                 on_stdout=lambda m: seen.append((m.line, time.monotonic())))
    assert [line for line, _ in seen] == ["a\n", "b\n"], seen
    assert seen[1][1] - seen[0][1] > 1.5, seen  # "a" came while the cell still ran

    env = sbx.run_code("import os\nos.environ['GREETING']")
    assert env.text == "hello from the host", env
    failed = sbx.run_code("1 / 0")
    assert failed.error is not None and failed.error.name == "ZeroDivisionError", failed

    sbx.run_code("kept = 7")
    try:
        sbx.run_code("while True: pass", timeout=3)
        raise AssertionError("the stuck cell did not time out")
    except TimeoutException:
        pass
    started = time.monotonic()
    after = sbx.run_code("kept * 6")
    assert after.text == "42" and time.monotonic() - started < 10, (after, time.monotonic() - started)

    ctx = sbx.create_code_context()
    assert sbx.run_code("kept", context=ctx).error.name == "NameError"
    assert sbx.run_code("y = 5\ny", context=ctx).text == "5"
    sbx.remove_code_context(ctx)

    # bash and JavaScript, as E2B's own tests call them
    assert sbx.run_code("echo $GREETING", language="bash").logs.stdout == ["hello from the host\n"]
    assert sbx.run_code("echo $FOO", envs={"FOO": "bar"}, language="bash").logs.stdout == ["bar\n"]
    assert sbx.run_code("echo ${FOO:-default}", language="bash").logs.stdout == ["default\n"]
    assert sbx.run_code("pwd", language="bash").logs.stdout == ["/home/user\n"]
    assert sbx.run_code("console.log('Hello, World!')", language="js").logs.stdout == ["Hello, World!\n"]
    sbx.run_code("const x = 1", language="js")
    assert sbx.run_code("x", language="js").results[0].text == "1"
    assert sbx.run_code("await Promise.resolve('Hello World!')", language="js").text == "Hello World!"
    assert sbx.run_code("process.env.FOO", envs={"FOO": "bar"}, language="javascript").text == "bar"
    assert "javascript" in [c.language for c in sbx.list_code_contexts()]
    js = sbx.create_code_context("/home", language="js")
    assert sbx.run_code("process.cwd()", context=js).text == "/home"
    print("kernel ok")
