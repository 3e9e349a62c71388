"""The error-kind tag: appended once, read back, absent on untagged messages."""

from trtpd import error_kinds


def test_tag_and_parse_round_trip():
    tagged = error_kinds.tag("KV dtype differs", "internal")
    assert tagged == "KV dtype differs [trtpd:internal]"
    assert error_kinds.parse(tagged) == ("KV dtype differs", "internal")
    assert error_kinds.parse("in ensemble 'ensemble', " + tagged) == ("in ensemble 'ensemble', KV dtype differs",
                                                                     "internal")


def test_retagging_replaces_the_kind_and_unknown_kinds_become_internal():
    assert error_kinds.tag(error_kinds.tag("x", "invalid_arg"), "unavailable") == "x [trtpd:unavailable]"
    assert error_kinds.tag("x", "nonsense") == "x [trtpd:internal]"


def test_an_untagged_or_foreign_tag_reads_as_unknown():
    assert error_kinds.parse("Stub process is not healthy.") == ("Stub process is not healthy.", None)
    assert error_kinds.parse("x [trtpd:bogus]") == ("x", None)
