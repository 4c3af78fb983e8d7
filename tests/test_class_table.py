"""The kernel-class table (stepscope/data/classes.toml) is the single source of each class: every
row has its entry in docs/KERNEL_CLASSES.md and every entry a row, every class but the two the
rules cannot give (memops, other) has a rule, the rules and the outputs know a class only from
the table, and no module of the package spells the class list itself."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from stepscope import classes
from stepscope.errors import InputError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "stepscope"
TABLE_TEXT = (PKG / "data" / "classes.toml").read_text()
DOCS = (ROOT / "docs" / "KERNEL_CLASSES.md").read_text()


def test_every_class_has_its_docs_entry_and_every_entry_a_class():
    anchors = re.findall(r'<a id="(class-[\w-]+)"></a>`([\w]+)`', DOCS)
    assert {a for a, _ in anchors} == {c.docs for c in classes.TABLE}
    # the entry names the class it anchors, once
    assert sorted(n for _, n in anchors) == sorted(classes.CLASSES)
    assert all(a == classes.BY_NAME[n].docs for a, n in anchors)


def test_every_class_the_rules_can_give_has_a_rule():
    rules = tomllib.loads((PKG / "data" / "rules.toml").read_text())
    named = {r["class"] for r in rules["rule"]}
    assert named <= set(classes.CLASSES)
    # memops come from the memcpy/memset tables, other is what no rule matched
    assert set(classes.CLASSES) - named == {"memops", classes.UNMATCHED}


def _class_literals(path: Path) -> list[tuple[int, list[str]]]:
    """(line, names) of each list/tuple/set/dict literal of the file whose strings (its elements,
    or a dict's keys) are three or more class names, and mostly class names."""
    out = []
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, (ast.List, ast.Tuple, ast.Set)):
            elts = n.elts
        elif isinstance(n, ast.Dict):
            elts = [k for k in n.keys if k is not None]
        else:
            continue
        strings = [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        names = [s for s in strings if s in classes.CLASSES]
        # mostly class names: a list of the minimum-bytes model's ops (sentinel.OPS: "gemm",
        # "norm", "add_norm", "kv_write", …) shares a few names with the classes and is no class list
        if len(names) >= 3 and 2 * len(names) > len(strings):
            out.append((n.lineno, names))
    return out


def test_no_module_lists_the_classes_itself():
    bad = {str(p.relative_to(ROOT)): hits for p in PKG.rglob("*.py") if (hits := _class_literals(p))}
    assert not bad


def test_the_check_sees_a_hard_coded_list(tmp_path):
    """The check above finds the literals this table replaced (tp.py's SHARDED, html.py's colours)."""
    probe = tmp_path / "probe.py"
    probe.write_text('SHARDED = ("gemm", "splitk_reduce", "attention_prefill", "attention_decode")\n'
                     'COLORS = {"gemm": "#4e79a7", "norm": "#59a14f", "rope": "#b6992d"}\n'
                     'ONE = ("embedding",)\n')
    assert _class_literals(probe) == [(1, ["gemm", "splitk_reduce", "attention_prefill", "attention_decode"]),
                                      (2, ["gemm", "norm", "rope"])]


def test_the_readers_take_the_table():
    from stepscope.analysis import classify, tp
    from stepscope.bytes import budget, minbytes
    from stepscope.render import html

    assert classify.CLASS_DTYPE.categories.to_list() == list(classes.CLASSES)
    assert html.CLASS_COLORS == {c.name: c.colour for c in classes.TABLE}
    legend = html._legend(False)
    assert all(f"background:{c.colour}\"></span>{c.name}" in legend for c in classes.TABLE)
    assert set(tp.SHARDED) == {c.name for c in classes.TABLE if c.tp_sharded}
    assert budget.CLASS_TO_OP == {c.name: c.byte_op for c in classes.TABLE if c.byte_op}
    for phase in ("decode", "prefill"):
        rows = minbytes.step_rows("llama-3.1-8b", 4, 512, phase)
        assert all(r["op"].split(":")[0] in classes.BY_NAME[r["class"]].min_ops for r in rows)
        assert {r["class"] for r in rows} >= {"gemm", "norm", "rope", "kv_cache_write", f"attention_{phase}"}


def test_a_rule_may_name_a_new_class_and_no_unknown_one(tmp_path):
    from stepscope.analysis.classify import load_rules

    ok = tmp_path / "ok.toml"
    ok.write_text('[[rule]]\nclass = "moe_gemm"\npattern = "^my_grouped_gemm$"\n')
    assert load_rules(ok).classify_name("my_grouped_gemm", "") == "moe_gemm"
    bad = tmp_path / "bad.toml"
    bad.write_text('[[rule]]\nclass = "experts"\npattern = "x"\n')
    with pytest.raises(InputError, match="unknown class 'experts'; use one of gemm, moe_gemm, "):
        load_rules(bad)


@pytest.mark.parametrize("edit, why", [
    (lambda t: t + '\n[[class]]\nname = "gemm"\ncolour = "#000000"\ntp_sharded = true\ntelling = true\ndocs = "x"\n',
     "twice"),
    (lambda t: t.replace('colour = "#4e79a7"\n', "", 1), "missing"),
    (lambda t: t.replace("tp_sharded = true", 'tp_sharded = "yes"', 1), "wrong type"),
    (lambda t: t.replace('name = "other"', 'name = "unknown"'), "last class must be `other`"),
])
def test_a_wrong_table_is_refused(edit, why):
    with pytest.raises(ValueError, match=why):
        classes.parse_table(edit(TABLE_TEXT))
