"""Event files that change under the tailer: replaced by a longer copy (rsync's temp file + rename), renamed to
``<name>.1`` while the writer goes on in a new file, truncated and rewritten. Each (tag, step) must appear once in
the store and in the server-side export, with the newer value when a step was rewritten, and the status must say
what was re-read. Plain appends and several files of one run holding different steps keep working as before."""
import csv
import io
import os
import shutil

import pytest

from flowlab.dashboard.store import Store
from flowlab.dashboard.views.scalars import export_text
from flowlab.summary import SummaryWriter, proto
from flowlab.summary.record import frame
from flowlab.summary.tailer import LogdirTailer

TAGS = ("loss", "acc")


def records(steps, offset=0.0, wall=1.7e9):
    """A file's bytes: its version record (``wall`` tells files apart, as a writer's start time does) and one
    scalar per tag and step, of value ``step + offset``."""
    out = [frame(proto.Event(wall_time=wall, file_version="brain.Event:2").SerializeToString())]
    for s in steps:
        for tag in TAGS:
            e = proto.Event(wall_time=wall + s, step=s,
                            summary=proto.Summary(value=[proto.Summary.Value(tag=tag, simple_value=s + offset)]))
            out.append(frame(e.SerializeToString()))
    return b"".join(out)


def event_path(logdir, run="run", n=0):
    path = os.path.join(logdir, run, f"events.out.tfevents.{1700000000 + n}.host.1.{n}")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


def stored(store):
    """{(run, tag): [(step, value)...]} of every scalar series, in stored order."""
    return {(s.run, s.tag): list(zip(s.steps.tolist(), s.values.tolist())) for s in store.series("scalar")}


def exported(store):
    """The same from the server-side CSV export of every series."""
    text = export_text([(s.run, s.tag, s.steps, s.wall_times, s.values) for s in store.series("scalar")], "csv")
    out = {}
    for row in csv.DictReader(io.StringIO(text)):
        out.setdefault((row["run"], row["tag"]), []).append((int(row["step"]), float(row["value"])))
    return out


def assert_once(store, steps, offset=0.0, run="run"):
    """Each tag holds each of ``steps`` exactly once, of value ``step + offset``, in the store and the export."""
    expected = {(run, tag): [(s, s + offset) for s in steps] for tag in TAGS}
    assert {k: sorted(v) for k, v in stored(store).items()} == expected
    assert {k: sorted(v) for k, v in exported(store).items()} == expected


def test_replaced_by_a_longer_copy_is_read_on_where_it_was(tmp_path):
    path = event_path(tmp_path)
    with open(path, "wb") as f:
        f.write(records(range(100)))
    store = Store(tmp_path)
    store.poll()
    assert_once(store, range(100))
    # rsync: the new version goes to a temporary file that is then renamed over the old one (a new inode)
    temp = os.path.join(os.path.dirname(path), ".tmp-rsync")
    shutil.copyfile(path, temp)
    with open(temp, "ab") as f:
        f.write(records(range(100, 150))[len(records([])):])
    os.replace(temp, path)
    store.poll()
    assert_once(store, range(150))
    status = store.status()
    assert status["rereads"] == 0 and status["files_followed"] == 1
    assert status["files"] == 1


def test_renamed_file_and_the_writers_new_file_are_each_read_once(tmp_path):
    path = event_path(tmp_path)
    with open(path, "wb") as f:
        f.write(records(range(100)))
    store = Store(tmp_path)
    store.poll()
    # rotation: the file becomes <name>.1 and the writer goes on in a new file under the old name
    os.rename(path, path + ".1")
    with open(path + ".1", "ab") as f:              # the last records still reach the renamed file
        f.write(records(range(100, 120))[len(records([])):])
    with open(path, "wb") as f:
        f.write(records(range(120, 150), wall=1.8e9))
    store.poll()
    assert_once(store, range(150))
    status = store.status()
    assert status["rereads"] == 0 and status["files_followed"] == 1 and status["files"] == 2


def test_truncated_and_rewritten_file_shows_each_step_once_with_the_new_value(tmp_path):
    path = event_path(tmp_path)
    with open(path, "wb") as f:
        f.write(records(range(100)))
    store = Store(tmp_path)
    store.poll()
    # the same inode, truncated and rewritten longer than it was, all between two polls
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(records(range(150), offset=1000.0, wall=1.8e9))
    store.poll()
    assert_once(store, range(150), offset=1000.0)
    status = store.status()
    assert status["rereads"] == 1
    (change,) = status["file_changes"]
    assert change["path"] == os.path.abspath(path) and "rewritten" in change["reason"]
    assert change["spans"] == {"loss": (0, 99), "acc": (0, 99)}


def test_truncated_then_rewritten_across_polls(tmp_path):
    path = event_path(tmp_path)
    with open(path, "wb") as f:
        f.write(records(range(100)))
    store = Store(tmp_path)
    store.poll()
    data = records(range(150), offset=1000.0, wall=1.8e9)
    half = len(records(range(50)))
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(data[:half])
    store.poll()
    assert_once(store, range(50), offset=1000.0)    # the file as it is now: the old steps are gone
    with open(path, "ab") as f:
        f.write(data[half:])
    store.poll()
    assert_once(store, range(150), offset=1000.0)
    assert store.status()["rereads"] == 1
    assert "truncated" in store.status()["file_changes"][0]["reason"]


def test_the_tailer_says_what_it_dropped_before_reading_again(tmp_path):
    path = event_path(tmp_path)
    with open(path, "wb") as f:
        f.write(records(range(10)))
    tailer = LogdirTailer(tmp_path)
    tailer.poll()
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(records(range(5, 20), wall=1.8e9))
    items = tailer.poll()
    first = items[0]
    assert first.kind == "reread" and first.run == "run"
    assert first.value["spans"] == {"loss": (0, 9), "acc": (0, 9)}
    assert sum(1 for d in items if d.kind == "scalar") == 30
    assert tailer.stats()["resets"] == 1


def test_plain_appends_and_several_files_of_one_run_are_unchanged(tmp_path):
    first, second = event_path(tmp_path, n=0), event_path(tmp_path, n=1)
    with open(first, "wb") as f:
        f.write(records(range(50)))
    store = Store(tmp_path)
    store.poll()
    with open(first, "ab") as f:
        f.write(records(range(50, 100))[len(records([])):])
    with open(second, "wb") as f:                   # a second file of the run, holding later steps
        f.write(records(range(100, 150), wall=1.8e9))
    store.poll()
    assert_once(store, range(150))
    status = store.status()
    assert status["rereads"] == 0 and status["files_followed"] == 0 and status["files"] == 2


def test_a_writer_reopening_its_run_adds_a_file_and_rereads_nothing(tmp_path):
    with SummaryWriter(tmp_path / "run") as w:
        for i in range(100):
            w.add_scalar("loss", float(i), i)
    store = Store(tmp_path)
    store.poll()
    with SummaryWriter(tmp_path / "run") as w:
        for i in range(100, 150):
            w.add_scalar("loss", float(i), i)
    store.poll()
    (series,) = store.series("scalar")
    assert series.steps.tolist() == list(range(150))
    assert store.status()["rereads"] == 0


def test_rsyncs_temporary_copy_is_not_read_while_it_is_written(tmp_path):
    path = event_path(tmp_path)
    with open(path, "wb") as f:
        f.write(records(range(100)))
    store = Store(tmp_path)
    store.poll()
    # rsync's temporary file is named after the file (".<name>.XXXXXX", so "tfevents" is in it) and a poll sees it
    temp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.Ab12Cd")
    longer = records(range(150))
    for end in (len(records(range(40))) + 7, len(records(range(120)))):   # shorter, then longer than what was read
        with open(temp, "wb") as f:
            f.write(longer[:end])
        store.poll()
        assert_once(store, range(100))              # the copy holds the same steps: not shown again
    with open(temp, "ab") as f:
        f.write(longer[len(records(range(120))):])
    os.replace(temp, path)
    store.poll()
    assert_once(store, range(150))
    status = store.status()
    assert status["rereads"] == 0 and status["files_followed"] == 1 and status["errors"] == {}


def test_files_with_the_same_first_record_are_told_apart_by_what_follows(tmp_path):
    # writers started in the same instant (or fixed-time test logs) write the same version record
    first, second = event_path(tmp_path, n=0), event_path(tmp_path, n=1)
    with open(first, "wb") as f:
        f.write(records(range(50)))
    store = Store(tmp_path)
    store.poll()
    data = records(range(50, 150))
    with open(second, "wb") as f:                   # so far only its version record: like a copy of the first
        f.write(data[:len(records([]))])
    store.poll()
    with open(second, "wb") as f:
        f.write(data)
    store.poll()
    assert_once(store, range(150))
    assert store.status()["files_followed"] == 0 and store.status()["files"] == 2


def test_remote_objects_copied_and_rewritten(tmp_path):
    """Object stores have no inode: a rename is a copy + delete, growth a replacement by a longer object."""
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    root = f"/rotation-{os.getpid()}-{id(tmp_path)}"
    name = f"{root}/run/events.out.tfevents.1700000000.host.1.0"
    fs.pipe_file(name, records(range(100)))
    store = Store(f"memory://{root}")
    try:
        store.poll()
        fs.pipe_file(name, records(range(120)))                    # grows: a longer object
        store.poll()
        assert_once(store, range(120))
        fs.pipe_file(name + ".1", records(range(130)))             # rotated: copied to <name>.1 (and grown)...
        fs.rm(name)                                                # ...and deleted
        store.poll()
        assert_once(store, range(130))
        assert store.status()["files_followed"] == 1 and store.status()["errors"] == {}
        fs.pipe_file(name + ".1", records(range(150), offset=1000.0, wall=1.8e9))    # rewritten
        store.poll()
        assert_once(store, range(150), offset=1000.0)
        assert store.status()["rereads"] == 1
    finally:
        fs.rm(root, recursive=True)


def test_the_status_line_says_what_changed(tmp_path):
    status_html = pytest.importorskip("flowlab.dashboard.views.status").status_html
    path = event_path(tmp_path)
    with open(path, "wb") as f:
        f.write(records(range(10)))
    store = Store(tmp_path)
    store.poll()
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(records(range(5), wall=1.8e9))
    store.poll()
    text = status_html(store.status())
    assert "1 re-read" in text and "truncated to" in text


def _start(step, wall):
    return frame(proto.Event(wall_time=wall, step=step, session_log=proto.SessionLog(status=1)).SerializeToString())


def test_a_rewritten_file_is_no_restart_of_its_run(tmp_path):
    """Reading a file again must not purge its run's other files: neither the file's own SessionLog START (which
    would count as a second one) nor, in files without a version record, its steps going back."""
    path, later = event_path(tmp_path, n=0), event_path(tmp_path, n=1)
    with open(path, "wb") as f:                     # START, steps 0..99
        data = records(range(100))
        f.write(data[:len(records([]))] + _start(0, 1.7e9) + data[len(records([])):])
    with open(later, "wb") as f:                    # another file of the run: steps 100..149
        f.write(records(range(100, 150), wall=1.8e9))
    store = Store(tmp_path)
    store.poll()
    assert_once(store, range(150))
    with open(path, "r+b") as f:                    # the first file rewritten: the same START, new values
        f.truncate(0)
        data = records(range(100), offset=0.5, wall=1.9e9)
        f.write(data[:len(records([]))] + _start(0, 1.9e9) + data[len(records([])):])
    store.poll()
    expected = {("run", tag): [(s, s + 0.5 * (s < 100)) for s in range(150)] for tag in TAGS}
    assert stored(store) == expected                # in step order: the re-read steps are merged, not appended
    assert exported(store) == expected


def test_a_rewritten_file_without_version_record_is_no_restart(tmp_path):
    def unversioned(steps, offset=0.0):
        return records(steps, offset)[len(records([])):]

    path, later = event_path(tmp_path, n=0), event_path(tmp_path, n=1)
    with open(path, "wb") as f:
        f.write(unversioned(range(100)))
    with open(later, "wb") as f:
        f.write(unversioned(range(100, 150)))
    store = Store(tmp_path)
    store.poll()
    assert_once(store, range(150))
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(unversioned(range(100), offset=0.5)[:-8] + b"x" * 8)   # rewritten (its last record still partial)
    store.poll()
    expected = {("run", tag): [(s, s + 0.5 * (s < 100)) for s in range(150) if s != 99 or tag == "loss"]
                for tag in TAGS}
    assert {k: sorted(v) for k, v in stored(store).items()} == expected
    assert store.status()["rereads"] == 1
