"""Results at the scale of a history: status, report and compare on a database of 20,000 runs with their
samples (``bench/history.py``: one campaign collected from job dirs, the others copied in SQL, a day apart,
throughput scaled per campaign).

Each answer is checked against an independent computation over the whole database (the views, or the
queries as they read every run): reading one campaign's rows only must not change a value. Times are not
asserted here (a shared machine); ``bench/history.py`` measures them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.history import build, campaign_name, factor
from harness.db import reportdata
from harness.db.status import status_rows
from harness.db.store import open_store
from harness.report.data import load_report_data

CAMPAIGNS, POINTS = 80, 250  # 20,000 runs


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    db = tmp_path_factory.mktemp("history") / "history.duckdb"
    info = build(db, campaigns=CAMPAIGNS, points=POINTS, hosts=2, gpus=2, ticks=20)
    return {"db": db, **info}


def test_the_history_is_shaped_as_collect_writes_it(history: dict[str, Any]) -> None:
    counts = history["counts"]
    assert counts["campaigns"] == CAMPAIGNS and counts["runs"] == counts["measurements"] == CAMPAIGNS * POINTS
    assert counts["sample_files"] == 2 * CAMPAIGNS * POINTS
    with open_store(history["db"], read_only=True) as st:
        per = st.con.execute("SELECT campaign, count(*), count(DISTINCT point_id), min(run_id), "
                             "bool_and(starts_with(run_id, campaign || '/')) FROM runs GROUP BY 1 "
                             "ORDER BY 1").fetchall()
        assert [c for c, *_ in per] == [campaign_name(i) for i in range(CAMPAIGNS)]
        assert all(n == POINTS and pts == POINTS and prefixed for _, n, pts, _, prefixed in per)
        # every copy's samples are its own: distinct file ids, as many rows per campaign as the collected one
        rows = st.con.execute("SELECT r.campaign, count(*) FROM sample_rows s JOIN sample_files f USING (file_id) "
                              "JOIN runs r USING (run_id) GROUP BY 1").fetchall()
        assert len({n for _, n in rows}) == 1 and sum(n for _, n in rows) == counts["sample_rows"]
        assert st.con.execute("SELECT count(DISTINCT file_id) FROM sample_files").fetchone()[0] == \
            counts["sample_files"]


def test_status_of_one_campaign_equals_the_views_over_every_run(history: dict[str, Any], cli: Any,
                                                                 tmp_path: Path) -> None:
    camp = campaign_name(CAMPAIGNS // 2)
    res = cli("status", "--campaign", camp, "--db", history["db"], "--workdir", tmp_path, "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    with open_store(history["db"], read_only=True) as st:
        by_outcome = dict(st.con.execute("SELECT outcome, count(*) FROM runs WHERE campaign = ? GROUP BY 1",
                                         [camp]).fetchall())
        assert doc["counts"] == by_outcome == {"ok": POINTS}
        assert {r["campaign"] for r in doc["rows"]} == {camp} and len(doc["rows"]) == POINTS
        view = {(r[0], r[1]): r[2:] for r in st.con.execute(
            "SELECT ps.point_id, ps.repeat, ps.attempts, ps.ok, o.startup_s, o.outside_train_fraction "
            "FROM point_status ps JOIN runs r USING (campaign, point_id, repeat) "
            "JOIN (SELECT run_id, max(startup_s) AS startup_s, max(outside_train_fraction) AS outside_train_fraction "
            "      FROM run_overhead GROUP BY 1) o USING (run_id) WHERE ps.campaign = ?", [camp]).fetchall()}
        mine = {(r["point_id"], r["repeat"]): (r["attempts"], r["ok"], r["startup_s"], r["outside_train_fraction"])
                for r in status_rows(st, camp)}
        assert mine == view
        assert all(v[2] is not None for v in mine.values())
        every = [r for r in status_rows(st) if r["campaign"] == camp]
        assert {(r["point_id"], r["repeat"]): (r["attempts"], r["ok"], r["startup_s"], r["outside_train_fraction"])
                for r in every} == view


def test_report_reads_one_campaign_and_its_values_equal_the_whole_database_s(history: dict[str, Any], cli: Any,
                                                                             tmp_path: Path) -> None:
    camp = campaign_name(3)
    with open_store(history["db"], read_only=True) as st:
        data = load_report_data(st, camp)
        assert data.campaign == camp and data.outcomes == {"ok": POINTS} and len(data.measurements) == POINTS
        assert data.gpu_samples == st.con.execute(
            "SELECT count(*) FROM samples s JOIN runs r USING (run_id) WHERE s.kind = 'gpu' AND r.campaign = ?",
            [camp]).fetchone()[0] > 0
        # the overhead rows: the view over every run, kept to this campaign
        view = st.fetch_dicts("SELECT o.* FROM run_overhead o JOIN runs r USING (run_id) WHERE r.campaign = ? "
                              "ORDER BY o.run_id, o.host", [camp])
        assert sorted(({k: r[k] for k in view[0]} for r in data.overhead),
                      key=lambda r: (r["run_id"], r["host"])) == view
        # the stage seconds: the query as it read every run's samples
        whole = st.fetch_dicts(
            """WITH last AS (SELECT run_id, host, max(t_wall) AS t FROM samples GROUP BY ALL),
                    per_trial AS (
                        SELECT s.run_id, s.stage, s.trial,
                               max(coalesce(s.duration_s, CASE WHEN s.end_wall IS NULL THEN l.t - s.start_wall END))
                                   AS seconds, bool_or(s.duration_s IS NULL) AS unfinished
                        FROM stages s JOIN runs r USING (run_id) LEFT JOIN last l USING (run_id, host)
                        WHERE r.campaign = ? GROUP BY ALL)
               SELECT run_id, stage, sum(seconds) AS seconds, bool_or(unfinished) AS unfinished
               FROM per_trial GROUP BY ALL ORDER BY 1, 2""", [camp])
        key = lambda r: (r["run_id"], r["stage"])  # noqa: E731
        assert sorted(reportdata.stage_seconds(st, camp), key=key) == whole and len(whole) >= POINTS
    out = tmp_path / "report.html"
    res = cli("report", "--db", history["db"], "-o", out)  # the latest campaign: the last one copied
    assert res.exit_code == 0, res.output
    latest = campaign_name(CAMPAIGNS - 1)
    assert f"campaign {latest} (the latest" in res.output and f"{POINTS} runs, {POINTS} measurements" in res.output
    assert latest in out.read_text()


@pytest.mark.parametrize("a, b", [(CAMPAIGNS - 2, CAMPAIGNS - 1), (0, CAMPAIGNS // 2 + 1)])
def test_compare_of_two_campaigns_reads_those_two(history: dict[str, Any], cli: Any, a: int, b: int) -> None:
    res = cli("compare", campaign_name(a), campaign_name(b), "--db", history["db"], "--json", "--threshold", "0.2")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)["rows"]
    assert len(rows) == POINTS and {(r["n_base"], r["n_cand"]) for r in rows} == {(1, 1)}
    # each campaign's throughput is the collected one's times factor(k): the ratio names the two campaigns read
    want = factor(b) / factor(a)
    assert factor(a) != factor(b)
    assert all(abs(r["ratio"] - want) < 1e-9 for r in rows)
