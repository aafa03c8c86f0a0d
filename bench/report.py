"""Targets, the markdown table, the JSON document and the chart."""

from __future__ import annotations

import functools
import json
import math
import operator
from collections.abc import Callable
from pathlib import Path
from typing import Any

Scenario = dict[str, Any]
Results = dict[str, Any]

GROUP_COLOURS = {
    "ours": "#d62728",
    "floor": "#7f7f7f",
    "peer": "#1f77b4",
    "baseline": "#ff7f0e",
    "reference": "#bcbd22",
}


# --------------------------------------------------------------------------- lookups


def _row(results: Results, scenario: str, key: str) -> dict[str, Any] | None:
    found = results["scenarios"].get(scenario)
    if found is None:
        return None
    return next((row for row in found["rows"] if row["key"] == key), None)


def _target(
    text: str, needed: str, figure: float | None, met: bool | None, note: str = ""
) -> dict[str, Any]:
    return {"target": text, "needed": needed, "figure": figure, "met": met, "note": note}


def _ratio_target(
    results: Results,
    scenario: str,
    ours: str,
    other: str,
    text: str,
    needed: str,
    test: Callable[[float], bool],
    *,
    invert: bool = False,
) -> dict[str, Any]:
    """Compare two rows of one scenario: ``ours / other`` (or ``other / ours`` for times)."""
    mine, theirs = _row(results, scenario, ours), _row(results, scenario, other)
    if mine is None or theirs is None:
        missing = ours if mine is None else other
        return _target(text, needed, None, None, f"not measured ({missing} did not run)")
    figure = theirs["value"] / mine["value"] if invert else mine["value"] / theirs["value"]
    return _target(text, needed, figure, test(figure))


def targets(results: Results) -> list[dict[str, Any]]:
    """Every target of issue 4, with the figure of this run and met / missed / not measured."""
    found: list[dict[str, Any]] = []
    for ours, name in (("ours-legacy", "legacy functions"), ("ours-context", "FeatureLock")):
        found.append(
            _ratio_target(
                results,
                "uncontended",
                ours,
                "floor-link",
                f"(1) uncontended, {name}: throughput vs bare link() cycle",
                ">= 0.7x",
                lambda r: r >= 0.7,
            )
        )
        found.append(
            _ratio_target(
                results,
                "uncontended",
                ours,
                "filelock",
                f"(1) uncontended, {name}: throughput vs filelock FileLock",
                ">= 3x",
                lambda r: r >= 3.0,
            )
        )
        found.append(
            _ratio_target(
                results,
                "uncontended",
                ours,
                "naive",
                f"(1) uncontended, {name}: throughput vs naive old design",
                ">= 3x",
                lambda r: r >= 3.0,
            )
        )
    contended = _ratio_target(
        results,
        "contended",
        "ours-legacy",
        "floor-link",
        "(2) 8 processes contending: throughput vs bare link(), 0 overlaps",
        ">= 0.5x, 0 overlaps",
        lambda r: r >= 0.5,
    )
    mine, floor = (
        _row(results, "contended", "ours-legacy"),
        _row(results, "contended", "floor-link"),
    )
    if mine is not None and floor is not None:
        contended["note"] = f"overlaps: ours {mine['overlaps']}, bare {floor['overlaps']}"
        if mine["overlaps"] or floor["overlaps"]:
            contended["met"] = False
    found.append(contended)
    storm = _ratio_target(
        results,
        "storm",
        "ours-legacy",
        "floor-link",
        "(3) claim storm: time vs bare link(), every feature claimed once",
        "<= 1.5x, exact",
        lambda r: r <= 1.5,
    )
    mine = _row(results, "storm", "ours-legacy")
    if mine is not None:
        faults = mine["duplicate_claims"] + mine["unclaimed"] + mine["missing_lock_files"]
        storm["note"] = (
            f"duplicates {mine['duplicate_claims']}, unclaimed {mine['unclaimed']}, "
            f"missing files {mine['missing_lock_files']}"
        )
        if faults and storm["met"] is not None:
            storm["met"] = False
    found.append(storm)
    found.append(
        _ratio_target(
            results,
            "status",
            "ours-status",
            "floor-loop",
            "(4) status of 10,000 locks: time vs bare scandir+read loop",
            "<= 2x",
            lambda r: r <= 2.0,
        )
    )
    for ours, name in (
        ("ours-module", "python -m mahabharatha"),
        ("ours-script", "console script"),
    ):
        found.append(
            _ratio_target(
                results,
                "cli",
                ours,
                "floor-typer",
                f"(5) CLI cold call ({name}) vs python -c 'import typer'",
                "<= 1.3x",
                lambda r: r <= 1.3,
            )
        )
    mine = _row(results, "handoff", "ours")
    if mine is None:
        found.append(_target("(6) hand-off latency p50", "<= 50 ms", None, None, "not measured"))
    else:
        found.append(
            _target(
                "(6) hand-off latency p50 (ms)",
                "<= 50 ms",
                mine["p50_ms"],
                mine["p50_ms"] <= 50.0,
                f"p99 {mine['p99_ms']:.1f} ms",
            )
        )
    from bench import pg_scenarios  # the four PostgreSQL targets of issue 12

    return found + _on_each_filesystem(results) + pg_scenarios.targets(results, _row, _target)


FILESYSTEM_SCENARIOS = ("uncontended", "uncontended-tmpfs")
"""Scenario (1) on the work folder's file system and on the tmpfs the run mounts."""
OURS_CYCLES = (("ours-context", "FeatureLock"), ("ours-legacy", "legacy functions"))
PEERS_TO_BEAT = (("flufl", "flufl.lock", 1.2), ("filelock", "filelock FileLock", 1.5))
"""Issue 30: per file system, ours at least this many times the peer's cycles per second."""
FLOOR_SHARE = 0.5
"""Issue 30: ours at least this share of the bare link floor, on the faster file system."""


def _filesystem(scenario: Scenario) -> str:
    return str(scenario.get("filesystem", {}).get("type", "work folder"))


def _on_each_filesystem(results: Results) -> list[dict[str, Any]]:
    """Issue 30's targets: ours against flufl.lock and filelock on every file system measured,
    and against the bare floor on the one where the floor ran faster."""
    measured = [results["scenarios"][n] for n in FILESYSTEM_SCENARIOS if n in results["scenarios"]]
    found = []
    for scenario in measured:
        for ours, name in OURS_CYCLES:
            for peer, peer_name, needed in PEERS_TO_BEAT:
                found.append(
                    _ratio_target(
                        results,
                        scenario["id"],
                        ours,
                        peer,
                        f"(1, {_filesystem(scenario)}) {name}: throughput vs {peer_name}",
                        f">= {needed}x",
                        functools.partial(operator.le, needed),  # needed <= ratio
                    )
                )
    floors = [(row["value"], s) for s in measured if (row := _row(results, s["id"], "floor-link"))]
    if floors:
        faster = max(floors, key=lambda pair: pair[0])[1]
        for ours, name in OURS_CYCLES:
            found.append(
                _ratio_target(
                    results,
                    faster["id"],
                    ours,
                    "floor-link",
                    f"(1, {_filesystem(faster)}, the faster) {name}: throughput vs bare link()",
                    f">= {FLOOR_SHARE}x",
                    lambda r: r >= FLOOR_SHARE,
                )
            )
    return found


# --------------------------------------------------------------------------- markdown


def _num(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.{digits}f}"


def _times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _pct(row: dict[str, Any]) -> str:
    value = row.get("spread_pct")
    return "-" if value is None or math.isnan(value) else f"{value:.0f}%"


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "**missed**", None: "not measured"}[met]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _scenario_lines(scenario: Scenario) -> list[str]:
    kind = scenario.get("kind", scenario["id"])  # the PostgreSQL scenarios reuse these tables
    floor = scenario.get("floor")
    out = [f"## ({scenario['number']}) {scenario['title']}", ""]
    sizes = ", ".join(f"{k} {v}" for k, v in scenario["sizes"].items())
    direction = "higher is better" if scenario["better"] == "higher" else "lower is better"
    out.append(
        f"Sizes: {sizes}. Median over rounds; {direction}; IQR: interquartile range "
        "of the rounds over the median (noise)."
        + (f" Ratio: median / median of `{floor}` in this run." if floor else "")
    )
    out.append("")
    rows = scenario["rows"]
    if kind == "uncontended":
        table = _table(
            ["contender", "group", "cycles/s", "µs/cycle", "x floor", "IQR"],
            [
                [
                    r["label"],
                    r["group"],
                    _num(r["value"]),
                    _num(r["us_per_cycle"], 1),
                    _times(r["ratio"]),
                    _pct(r),
                ]
                for r in rows
            ],
        )
    elif kind == "contended":
        table = _table(
            [
                "contender",
                "group",
                "cycles/s (all procs)",
                "overlaps",
                "acquisitions",
                "x floor",
                "IQR",
            ],
            [
                [
                    r["label"],
                    r["group"],
                    _num(r["value"]),
                    str(r["overlaps"]),
                    str(r["acquisitions"]),
                    _times(r["ratio"]),
                    _pct(r),
                ]
                for r in rows
            ],
        )
    elif kind == "storm":
        table = _table(
            [
                "contender",
                "group",
                "time (ms)",
                "claims/s",
                "duplicate claims",
                "unclaimed",
                "x floor",
                "IQR",
            ],
            [
                [
                    r["label"],
                    r["group"],
                    _num(r["value"] * 1000, 1),
                    _num(r["claims_per_s"]),
                    str(r["duplicate_claims"]),
                    str(r["unclaimed"]),
                    _times(r["ratio"]),
                    _pct(r),
                ]
                for r in rows
            ],
        )
    elif kind == "status":
        table = _table(
            ["contender", "group", "time (ms)", "locks/s", "x floor", "IQR"],
            [
                [
                    r["label"],
                    r["group"],
                    _num(r["value"] * 1000, 1),
                    _num(r["locks_per_s"]),
                    _times(r["ratio"]),
                    _pct(r),
                ]
                for r in rows
            ],
        )
    elif kind == "cli":
        table = _table(
            ["command", "group", "time (ms)", "x floor", "IQR"],
            [
                [r["label"], r["group"], _num(r["value"] * 1000, 1), _times(r["ratio"]), _pct(r)]
                for r in rows
            ],
        )
    else:
        table = _table(
            ["contender", "group", "p50 (ms)", "p99 (ms)", "mean (ms)", "max (ms)", "hand-offs"],
            [
                [
                    r["label"],
                    r["group"],
                    _num(r["p50_ms"]),
                    _num(r["p99_ms"]),
                    _num(r["mean_ms"]),
                    _num(r["max_ms"]),
                    str(r["handoffs"]),
                ]
                for r in rows
            ],
        )
    out += table
    if kind == "uncontended" and "filesystem" in scenario:
        out += _peer_ratio_lines(scenario)
    for skipped in scenario.get("skipped", []):
        out.append("")
        out.append(f"Skipped: {skipped['label']}: {skipped['reason']}.")
    out.append("")
    return out


def _peer_ratio_lines(scenario: Scenario) -> list[str]:
    """Ours over each peer to beat and over the floor, on this scenario's file system."""
    fs = scenario["filesystem"]
    rows = {row["key"]: row for row in scenario["rows"]}
    others = [(key, name) for key, name, _ in PEERS_TO_BEAT] + [("floor-link", "bare link()")]
    out = ["", f"File system: {fs['type']} ({fs['source']} on {fs['mount_point']}).", ""]
    return out + _table(
        ["ours, cycles/s over", *(name for _, name in others)],
        [
            [
                name,
                *(
                    _times(rows[ours]["value"] / rows[key]["value"]) if key in rows else "-"
                    for key, _ in others
                ),
            ]
            for ours, name in OURS_CYCLES
            if ours in rows
        ],
    )


def markdown(results: Results, chart: str | None) -> str:
    machine = results["machine"]
    fs = machine["filesystem"]
    lines = [
        "# Benchmark results",
        "",
        f"Produced by `{results['command']}` on {results['started']} "
        f"({results['mode']} sizes, {results['elapsed_s']:.0f} s). "
        "Every figure is a median over rounds in which all contenders of a scenario ran side "
        "by side; every ratio is against the floor measured in the same run. "
        "See `bench/README.md` for what each scenario measures.",
        "",
        "## Targets (issue 4)",
        "",
    ]
    lines += _table(
        ["target", "needed", "this run", "result", "note"],
        [
            [
                t["target"],
                t["needed"],
                _num(t["figure"]) + ("" if "ms" in t["target"] else "x")
                if t["figure"] is not None
                else "-",
                _verdict(t["met"]),
                t["note"],
            ]
            for t in results["targets"]
        ],
    )
    if "second_filesystem" in results:
        lines += ["", f"Scenario (1): {results['second_filesystem']}."]
    if any(t["met"] is False for t in results["targets"]):
        lines += ["", "Misses and what dominates them: `bench/PROFILE.md`."]
    lines += ["", "## Machine", ""]
    versions = ", ".join(f"{k} {v}" for k, v in machine["versions"].items() if v)
    lines += _table(
        ["", ""],
        [
            ["CPU", machine["cpu_model"]],
            ["cores", f"{machine['cores']} ({machine['usable_cores']} usable)"],
            ["kernel", machine["kernel"]],
            ["Python", machine["python"]],
            [
                "file system of the work folder",
                f"{fs['type']} ({fs['source']} on {fs['mount_point']})",
            ],
            [
                "load average at start / end",
                " / ".join(
                    " ".join(f"{x:.2f}" for x in machine[k])
                    for k in ("loadavg_at_start", "loadavg_at_end")
                    if k in machine
                ),
            ],
            [
                "I/O pressure at start / end (PSI some, avg60)",
                " / ".join(
                    "-" if machine.get(k) is None else f"{machine[k]:.2f}%"
                    for k in ("io_pressure_at_start", "io_pressure_at_end")
                ),
            ],
            ["packages", versions],
        ],
    )
    lines.append("")
    if chart:
        lines += [f"![benchmark chart]({chart})", ""]
    for scenario in results["scenarios"].values():
        lines += _scenario_lines(scenario)
    return "\n".join(lines).rstrip() + "\n"


def write_json(results: Results, path: Path) -> None:
    path.write_text(json.dumps(results, indent=1, sort_keys=False) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------- chart


def chart(results: Results, path: Path) -> str | None:
    """One panel per scenario; bars coloured by group; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    scenarios = list(results["scenarios"].values())
    if not scenarios:
        return None
    columns = min(3, len(scenarios))
    lines_of_panels = math.ceil(len(scenarios) / columns)
    figure, axes = plt.subplots(
        lines_of_panels, columns, figsize=(7.0 * columns, 3.8 * lines_of_panels), squeeze=False
    )
    for axis in axes.flat[len(scenarios) :]:
        axis.set_visible(False)
    for axis, scenario in zip(axes.flat, scenarios, strict=False):
        _panel(axis, scenario)
    figure.suptitle(
        f"mahabharatha feature locks vs floors and peers ({results['mode']} run, "
        f"{results['machine']['cpu_model']}, {results['machine']['cores']} cores, "
        f"{results['machine']['filesystem']['type']})",
        fontsize=11,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path.name


def _short(label: str) -> str:
    return label if len(label) <= 48 else label[:46] + "…"


def _panel(axis: Any, scenario: Scenario) -> None:
    rows = scenario["rows"]
    labels = [_short(r["label"]) for r in rows]
    colours = [GROUP_COLOURS.get(r["group"], "#333333") for r in rows]
    positions = list(range(len(rows)))
    if scenario["id"] == "handoff":
        p50 = [r["p50_ms"] for r in rows]
        p99 = [r["p99_ms"] for r in rows]
        axis.barh([p - 0.2 for p in positions], p50, height=0.4, color=colours, label="p50")
        axis.barh(
            [p + 0.2 for p in positions], p99, height=0.4, color=colours, alpha=0.45, label="p99"
        )
        axis.axvline(50, color="black", linestyle="--", linewidth=0.8)
        axis.legend(fontsize=7, loc="lower right")
        values = p50 + p99  # for the axis limit
        unit = "ms (p50 solid, p99 light; target p50 <= 50)"
    else:
        scale, unit = 1.0, scenario["unit"]
        if unit == "s":
            scale, unit = 1000.0, "ms"
        values = [r["value"] * scale for r in rows]
        axis.barh(positions, values, color=colours)
        for position, row, value in zip(positions, rows, values, strict=True):
            if row.get("ratio") is not None:
                axis.text(value, position, f" {row['ratio']:.2f}x", va="center", fontsize=7)
        unit += " (higher is better)" if scenario["better"] == "higher" else " (lower is better)"
    axis.set_yticks(positions, labels, fontsize=7)
    axis.invert_yaxis()
    axis.set_xlabel(unit, fontsize=8)
    axis.tick_params(axis="x", labelsize=7)
    axis.set_title(f"({scenario['number']}) {scenario['title']}", fontsize=9)
    if values:
        axis.set_xlim(0, max(values) * 1.25 or 1)
