"""Stand-in for the `expecttest` package, which torch's test utilities import but Debian
bookworm does not package. Only used when the real module is absent (this directory is last
on PYTHONPATH). Provides what torch.testing._internal.common_utils uses: the ACCEPT flag
and a TestCase with assertExpectedInline (compares against the inline expectation; never
rewrites files)."""
import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    longMessage = True

    def assertExpectedInline(self, actual, expect, skip=0):  # noqa: N802 - upstream name
        self.assertMultiLineEqual(expect.strip("\n"), actual.strip("\n") if isinstance(actual, str) else actual)

    def assertExpectedRaisesInline(self, exc_type, callable, expect, *args, **kwargs):  # noqa: N802
        try:
            callable(*args, **kwargs)
        except exc_type as e:
            self.assertExpectedInline(str(e), expect)
            return
        self.fail("Did not raise when expected to")
