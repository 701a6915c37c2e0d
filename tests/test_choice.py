"""The two answer parsers on a table of real-looking responses (4 options unless stated)."""
import pytest

from algorithms.choice import parse_official, parse_robust

OPTIONS = ["a red car", "a blue bicycle", "two dogs", "the man in the hat"]

# response, official letter, robust letter (None = no answer / ambiguous)
CASES = [
    ("B", "B", "B"),
    ("b", None, "B"),
    ("(B)", "B", "B"),
    ("b)", None, "B"),
    ("Answer: c", None, "C"),
    ("The answer is D.", "D", "D"),
    ("The best answer is: A", "A", "A"),
    ("C. two dogs", "C", "C"),
    ("  D  ", "D", "D"),
    ("**A**", "A", "A"),
    ("Based on the video, the answer is C.", "B", "C"),       # official reads the B of "Based"
    ("a blue bicycle", None, "B"),                              # option text without its letter
    ("Two dogs.", None, "C"),
    ("I think it is (b)", None, "B"),
    ("A or B", "A", None),                                      # several letters
    ("A dog is running", "A", None),                            # article, no letter, no option text
    ("none of the options", None, None),
    ("", None, None),
    ("E", None, None),                                          # out of range for 4 options
    ("The correct option is B because the man rides it.", "B", "B"),
    ("Option C", "C", "C"),
    ("answer: (d)", None, "D"),
    ("A and C are both plausible", "A", None),
    ("B. a blue bicycle\nC. two dogs", "B", None),              # echoed options: ambiguous
    ("the man in the hat is shown", None, "D"),
    ("It is a red car.", None, "A"),
    ("Because the video shows a cat, C", "B", "C"),
    ("The answer is a red car", None, "A"),
    ("[D]", "D", "D"),
    ("c.", None, "C"),
    ("The answer is B, not C.", "B", "B"),
    ("Best option: (A)", "A", "A"),
    ("The video shows two dogs playing.", None, "C"),
    ("Definitely B", "D", "B"),                                 # official reads the D of "Definitely"
    ("A", "A", "A"),
    ("Answer: A", "A", "A"),
]


def test_table_is_large_enough():
    assert len(CASES) >= 25
    assert sum(o != r for _, o, r in CASES) >= 10  # the parsers really differ


@pytest.mark.parametrize("response,official,robust", CASES)
def test_parsers(response, official, robust):
    assert parse_official(response, 4) == official
    assert parse_robust(response, OPTIONS) == robust


def test_five_options_and_none_response():
    five = OPTIONS + ["nothing happens"]
    assert parse_official("E", 5) == "E"
    assert parse_official("E", 4) is None
    assert parse_robust("(e)", five) == "E"
    assert parse_robust("nothing happens", five) == "E"
    assert parse_official(None, 4) is None
    assert parse_robust(None, OPTIONS) is None


def test_official_long_answer_without_letter():
    text = "the person on the left is holding something that looks like it might be food"
    assert parse_official(text, 4) is None


def test_robust_option_text_prefers_longest_containing():
    opts = ["dog", "a brown dog", "cat", "bird"]
    assert parse_robust("It is a brown dog.", opts) == "B"   # "dog" is inside "a brown dog"
    assert parse_robust("a dog and a cat", opts) is None       # two unrelated options


def test_bad_num_options():
    with pytest.raises(ValueError):
        parse_official("A", 0)
    with pytest.raises(ValueError):
        parse_robust("A", [])
