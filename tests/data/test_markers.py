from mopd.data.markers import read_marker


def test_marker_missing_broken_or_not_an_object_reads_as_none(tmp_path):
    p = tmp_path / "world.json"
    assert read_marker(p) is None
    p.write_text('{"settings": {"seed": 3}')          # a build killed mid-write
    assert read_marker(p) is None
    p.write_bytes(b"\xff\xfe{}")
    assert read_marker(p) is None
    p.write_text("[1, 2]")
    assert read_marker(p) is None
    p.write_text('{"settings": {"seed": 3}}')
    assert read_marker(p) == {"settings": {"seed": 3}}
