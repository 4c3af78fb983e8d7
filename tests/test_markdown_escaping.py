"""The Markdown report renders trace-derived strings as text (issue 30): a name that holds HTML,
backticks, pipes, CR or LF, rendered by markdown-it with raw HTML allowed (as many wikis and doc
sites do), yields no tag of its own, no broken table row, and shows as itself."""

from __future__ import annotations

import re
import shutil
import sqlite3

import pytest
from markdown_it import MarkdownIt
from tests.conftest import CliRunner

from stepscope.cli import app
from stepscope.render.names import controls, md_code, md_text
from tests.conftest import FIXTURES, need

EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"

PAYLOADS = {
    "step": "<img src=x onerror=alert(1)>",
    "api": "<svg onload=alert(2)>",
    "kernel": "\r| <script>alert(3)</script> ``` `x` |\n<b>",
    "gpu": "<iframe src=javascript:alert(5)>",
}
TAGS = ("img", "svg", "script", "iframe", "b")


def md(html_allowed=True):
    return MarkdownIt("commonmark", {"html": html_allowed}).enable("table")


@pytest.fixture
def damaged(tmp_path):
    # a file name with backticks and a tag in it, and every name kind replaced by a payload
    p = tmp_path / "t`<img src=x onerror=alert(4)>`.sqlite"
    shutil.copy(need(EAGER), p)
    with sqlite3.connect(p) as c:
        c.execute("UPDATE NVTX_EVENTS SET text = text || ' ' || ? WHERE text LIKE 'step %'", (PAYLOADS["step"],))
        c.execute("UPDATE StringIds SET value = value || ? WHERE value = 'cuLaunchKernelEx'", (PAYLOADS["api"],))
        c.execute("UPDATE StringIds SET value = value || ? WHERE id IN (SELECT shortName FROM CUPTI_ACTIVITY_KIND_KERNEL)"
                  , (PAYLOADS["kernel"],))
        c.execute("UPDATE TARGET_INFO_GPU SET name = ?", ("NVIDIA H200 " + PAYLOADS["gpu"],))
        n_kernel_names = c.execute("SELECT COUNT(DISTINCT shortName) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    return p, n_kernel_names


def test_no_tag_from_the_trace_survives(damaged, tmp_path):
    trace, n_names = damaged
    out = tmp_path / "r.md"
    r = CliRunner().invoke(app, ["report", str(trace), "-o", str(out)])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "\r" not in text  # a CR from a name would end a table row in many renderers
    html = md().render(text)
    for tag in TAGS:
        assert not re.search(rf"<{tag}[\s>/]", html), (tag, html)
    # what was escaped is still shown, as text
    assert "&lt;img src=x onerror=alert(1)&gt;" in html  # the step name
    assert "&lt;svg onload=alert(2)&gt;" in html         # the API of "next launched by"
    assert "&lt;script&gt;alert(3)&lt;/script&gt;" in html and "\\x0d" in html  # a kernel name, its CR shown
    assert "&lt;iframe src=javascript:alert(5)&gt;" in html  # the GPU name
    assert "alert(4)" in html and "onerror=alert(4)>" not in html  # the file name
    # every kernel row stays one row of five cells: the name's pipes and line ends did not split it
    top = text.split("### Top kernels", 1)[1].split("\n\n", 2)[1]
    rows = [line for line in top.splitlines()[2:]]
    assert len(rows) == min(10, n_names)
    table = md().render(top)
    assert table.count("<tr>") == len(rows) + 1
    assert all(row.count("<td") == 5 for row in table.split("<tr>")[2:])


@pytest.mark.parametrize("name", ["`", "``a```b`", " ` ", "a|b", "<a href=x>y</a>", "x\ny", "x\r\n", "\x1b[2J",
                                  "[link](javascript:alert(1))", "&lt;b&gt;", "*a* _b_ \\`"])
def test_a_code_span_and_a_text_show_the_string_itself(name):
    shown = controls(name)
    for rendered in (md_code(name), md_text(name)):
        html = md().renderInline(rendered)
        plain = md(False).renderInline(rendered)
        assert "<a" not in html and "<b>" not in html and "<em>" not in html and "<strong>" not in html
        # the rendered text, once its entities are read, is the name with its controls escaped
        from html import unescape
        body = re.sub(r"</?code>", "", html)
        assert unescape(body) == shown or unescape(body) == shown.strip(), (rendered, html)
        assert plain == html
