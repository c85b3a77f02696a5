"""Every tab of the dashboard on an ``s3://`` logdir, in headless Chromium: ``flowlab serve --logdir s3://...``
against a real S3-compatible server (moto, ``s3_endpoint`` in tests/conftest.py; credentials and endpoint from the
AWS environment, as a user gives them). The logdir is the one ``flowlab demo`` writes (every summary kind, a run that
turns NaN, an embedding with its sprite, the train job's graph and health reports), plus a flowlab structure graph
(``structure_graph.json``) in its first run, uploaded as a sync tool would: so Graph, Projector, Anomalies and Health,
which read more than plain scalars, draw from the bucket what they draw from the disk."""
import os

import pytest

from dashboard_page import IDLE_JS, flowlab_serve, open_dashboard
from jupyter_page import CHROMIUM
from dashboard_page import SHOWN_JS, TABS, demo_logdir
from test_dashboard_views_structure import mlp_job

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"needs Debian's chromium at {CHROMIUM}")
pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[test]')")
s3fs = pytest.importorskip("s3fs")
boto3 = pytest.importorskip("boto3")

BUCKET = "flowlab-dashboard"
AWS_ENV = dict(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
# What each tab must show of the demo's logdir besides a drawn plot (text of its Divs, or a plot title).
SAYS = {"projector": "PCA of", "anomalies": "NaN"}
# The Graph menu's labels: "run: job" for a run's structure-graph jobs, "run" for a run's GraphDef.
GRAPH_MENU_JS = """() => [...Bokeh.documents[0].all_models].filter((m) => m.constructor.__name__ === "Select" &&
  m.title === "Graph").flatMap((m) => m.options.map((o) => Array.isArray(o) ? o[1] : o))"""


@pytest.fixture(scope="module")
def served(s3_endpoint, tmp_path_factory):
    import flowlab as flow
    local = demo_logdir(tmp_path_factory.mktemp("demo"))
    first = sorted(p for p in local.iterdir() if p.is_dir())[0]
    flow.clear_default_session()
    mlp_job()
    flow.summary.Graph(first).write_structure_graph()
    flow.clear_default_session()
    boto3.client("s3", endpoint_url=s3_endpoint, **{k.lower(): v for k, v in AWS_ENV.items()
                                                    if k != "AWS_DEFAULT_REGION"},
                 region_name="us-east-1").create_bucket(Bucket=BUCKET)
    fs = s3fs.S3FileSystem(skip_instance_cache=True, endpoint_url=s3_endpoint, key="testing", secret="testing")
    uploaded = 0
    for d, _, files in os.walk(local):
        for n in files:
            rel = os.path.relpath(os.path.join(d, n), local).replace(os.sep, "/")
            with open(os.path.join(d, n), "rb") as f:
                fs.pipe_file(f"{BUCKET}/demo/{rel}", f.read())
            uploaded += 1
    assert uploaded >= 7 and fs.find(f"{BUCKET}/demo")
    saved = {k: os.environ.get(k) for k in (*AWS_ENV, "AWS_ENDPOINT_URL")}
    os.environ.update(AWS_ENV, AWS_ENDPOINT_URL=s3_endpoint)      # the server process reads them, as boto does
    try:
        with flowlab_serve(f"s3://{BUCKET}/demo", tmp_path_factory.mktemp("server") / "stderr.txt") as (url, log):
            yield url, log, first.name
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.mark.parametrize("tab", TABS)
def test_every_tab_draws_an_s3_logdir(served, tab, chromium):
    url, log, first = served
    warnings = []
    page, errors = open_dashboard(chromium, f"{url}?tab={tab}", warnings=warnings,
                                  viewport={"width": 1600, "height": 1000})
    try:
        page.wait_for_function(f"() => {{ const s = ({SHOWN_JS})(); return s.plots.length > 0 || "
                               f"{str(tab == 'text').lower()} && s.text.length > 0 && !/^No /.test(s.text.trim()); }}",
                               polling=100, timeout=60000)
        page.wait_for_timeout(1500)
        page.wait_for_function(IDLE_JS, polling=50, timeout=30000)
        shown = page.evaluate(SHOWN_JS)
        assert shown["plots"] or tab == "text", f"{tab} drew no plot: {shown['text'][:300]}"
        assert SAYS.get(tab, "") in shown["text"] + " ".join(shown["plots"]), shown["text"][:300]
        assert "Could not read" not in shown["text"], shown["text"][:300]
        if tab == "graph":                  # the structure graph's job, read from the bucket, beside the GraphDefs
            assert f"{first}: mlp_job" in page.evaluate(GRAPH_MENU_JS)
        status = page.evaluate("() => Bokeh.documents[0].get_model_by_name('status').text")
        assert f"s3://{BUCKET}/demo" in status and " 0 skipped" in status, status
        assert warnings == [] and errors == [], (warnings + errors)[:5]
        log.seek(0)
        assert "Traceback" not in log.read()
    finally:
        page.close()
