"""The answer rules of algorithms.choice on tables of real-looking responses (4 options unless stated).

RELEASED's letters are what the released code returns for each response (worked out by reading it and by running
the released functions, copied out of the fetched repositories, in a scratch folder outside the project):
Video-MME thanku-all/parse_answer@afd52cfe:eval_your_results.py:extract_characters_regex, MLVU
JUNJIE99/MLVU@fd060c10:evaluation/multiple_choice_evaluation/choice_bench.py:check_ans (the gold letter for which
it returns True), LongVideoBench lmms-eval@75571cfe:lmms_eval/tasks/longvideobench/utils.py:
parse_multi_choice_response (None where it draws random.choice), WorldSense
VLMEvalKit@e8e78f05:vlmeval/dataset/utils/worldsense.py:extract_characters_regex (None for its '').
"""
import pytest

from algorithms.choice import RULES, VIDEOMME_PREFIXES, WORLDSENSE_PREFIXES, parse, parse_official, parse_robust

OPTIONS = ["a red car", "a blue bicycle", "two dogs", "the man in the hat"]

# response, videomme, mlvu, lvb, worldsense
RELEASED = [
    ('B', 'B', 'B', 'B', 'B'),
    ('b', None, None, None, None),
    ('(B)', 'B', 'B', 'B', 'B'),
    ('b)', None, None, None, None),
    (' B', 'B', None, 'B', 'B'),
    ('B.', 'B', None, 'B', 'B'),
    ('B. a blue bicycle', 'B', None, 'B', 'B'),
    ('(B) a blue bicycle', 'B', 'B', 'B', 'B'),
    ('B) a blue bicycle', 'B', 'B', 'B', 'B'),
    ('Answer: c', None, None, 'A', None),
    ('Answer: C', 'C', None, 'A', 'C'),
    ('The answer is D.', 'D', None, 'D', 'D'),
    ('The best answer is: A', 'A', None, 'A', 'A'),
    ('The correct answer is (C)', 'C', 'C', 'C', 'C'),
    ('The best option is C', 'C', None, 'C', 'C'),
    ('The best option isThe correct option is C', 'C', None, 'C', 'C'),
    ('Best answer: D', 'B', None, 'D', 'B'),
    ('Best option: D', 'B', None, 'D', 'B'),
    ('Best answer:Best option: D', 'D', None, 'D', 'D'),
    ('Option: B', 'B', None, 'B', 'B'),
    ('C. two dogs', 'C', None, 'C', 'C'),
    ('  D  ', 'D', None, 'D', 'D'),
    ('**A**', 'A', None, 'A', 'A'),
    ('**Answer:** D', 'D', None, 'A', 'D'),
    ('The answer is: **C**', 'C', None, 'C', 'C'),
    ('Based on the video, the answer is C.', 'B', None, 'B', 'B'),
    ('a blue bicycle', None, None, None, None),
    ('I think it is (b)', None, None, None, None),
    ('A or B', 'A', None, 'A', 'A'),
    ('A dog is running', 'A', None, 'A', 'A'),
    ('none of the options', None, None, None, None),
    ('', None, None, None, None),
    ('E', None, None, 'E', None),
    ('E)', None, None, 'E', None),
    ('The answer is E.', None, None, 'E', None),
    ('F', None, None, None, None),
    ('B. a blue bicycle\nC. two dogs', 'B', None, 'B', 'B'),
    ('Because the video shows a cat, C', 'B', None, 'B', 'B'),
    ('Definitely B', 'D', None, 'D', 'D'),
    ('答案是B', 'B', None, 'B', 'B'),
    ('答案：C', 'C', None, 'C', 'C'),
    ('我认为答案是 (A)', 'A', 'A', 'A', 'A'),
    ('正确答案是：B. 一辆蓝色自行车', 'B', None, 'B', 'B'),
    ('（B）', 'B', None, 'B', 'B'),
    ('B）', 'B', None, 'B', 'B'),
    (')', None, None, None, None),
    (')B', 'B', None, 'B', 'B'),
    ('B)C)', 'B', 'B', 'B', 'B'),
    ('(C)B)', 'C', 'C', 'C', 'C'),
    ('x)', None, None, None, None),
    ('D) the man in the hat', 'D', 'D', 'D', 'D'),
    ('Best Option: (C) two dogs', 'B', 'C', 'B', 'B'),
    ('THE ANSWER IS B', 'A', None, 'E', 'A'),
    ('the answer is b', None, None, None, None),
    ('The answer isB', 'B', None, 'B', 'B'),
    ('The correct answer B', 'B', None, 'B', 'B'),
    ('In the video, a man rides a blue bicycle through the park while two dogs watch him from the side', None, None, None, None),
    ('in the video, a man rides a bicycle through the park while two dogs watch him from the side of the road', None, None, None, None),
    ('in the video a man rides a bicycle through the park while two dogs watch him', None, None, None, None),
    ('After watching carefully, I would say option (C) is correct.', 'A', 'C', 'A', 'A'),
    ('Sorry, I cannot determine the answer.', None, None, None, None),
    ('Eventually the dog runs. C', 'C', None, 'E', 'C'),
    ('Every option is wrong except B', 'B', None, 'E', 'B'),
    ('ABCD', 'A', None, 'A', 'A'),
    ('DCBA', 'D', None, 'D', 'D'),
    ('Apple', 'A', None, 'A', 'A'),
    ('Cat', 'C', None, 'C', 'C'),
    ('E) The answer is B', 'B', None, 'E', 'B'),
    ('Final answer: C', 'C', None, 'C', 'C'),
    ('The correct option: A', 'A', None, 'A', 'A'),
    ('### Answer\nB', 'A', None, 'A', 'A'),
    ('None', None, None, None, None),
]


def test_released_table_is_large_enough():
    assert len(RELEASED) >= 40
    for k in range(1, 5):   # every rule has answers and non-answers, and the rules really differ
        assert sum(r[k] is None for r in RELEASED) >= 8 and sum(r[k] is not None for r in RELEASED) >= 8
    assert sum(r[1] != r[3] for r in RELEASED) >= 8 and sum(r[1] != r[2] for r in RELEASED) >= 30


@pytest.mark.parametrize("response,videomme,mlvu,lvb,worldsense", RELEASED)
def test_released_rules(response, videomme, mlvu, lvb, worldsense):
    assert parse(response, OPTIONS, "videomme") == videomme
    assert parse(response, OPTIONS, "mlvu") == mlvu
    assert parse(response, OPTIONS, "lvb") == lvb
    assert parse(response, OPTIONS, "worldsense") == worldsense


def test_prefix_lists_as_python_reads_the_releases():
    # two missing commas in each release: adjacent literals concatenate
    assert len(VIDEOMME_PREFIXES) == 10 and len(WORLDSENSE_PREFIXES) == 8
    assert "The best option isThe correct option is" in VIDEOMME_PREFIXES
    assert "Best answer:Best option:" in WORLDSENSE_PREFIXES
    assert "The best option is" not in VIDEOMME_PREFIXES and "Best answer:" not in WORLDSENSE_PREFIXES
    # so "Answer: C" loses its prefix for Video-MME/WorldSense but not for lmms-eval's LongVideoBench list
    assert parse("Answer: C", OPTIONS, "videomme") == "C" and parse("Answer: C", OPTIONS, "lvb") == "A"


def test_mlvu_option_count_and_letters_beyond():
    assert parse("E) x", OPTIONS + ["e"], "mlvu") == "E"
    assert parse("E) x", OPTIONS, "mlvu") is None
    assert parse("B", ["x", "y"], "mlvu") == "B" and parse("C", ["x", "y"], "mlvu") is None
    # lvb: [ABCDE] whatever the count, as released (a 2-option question can get "D", scored wrong)
    assert parse("D", ["x", "y"], "lvb") == "D"


def test_none_response_and_bad_arguments():
    for rule in RULES:
        assert parse(None, OPTIONS, rule) is None
    with pytest.raises(ValueError, match="unknown answer rule"):
        parse("A", OPTIONS, "official")
    with pytest.raises(ValueError, match="num_options"):
        parse("A", [], "videomme")


def test_parse_official_is_the_benchmark_rule():
    assert parse_official("Answer: C", OPTIONS, "lvb") == "A"
    assert parse_official("Answer: C", OPTIONS, "videomme") == "C"
    assert parse_official("B.", OPTIONS, "mlvu") is None
    assert parse_official("B.", OPTIONS, None) == "B"


# response, robust letter (None = no answer / ambiguous)
CASES = [
    ('B', 'B'),
    ('b', 'B'),
    ('(B)', 'B'),
    ('b)', 'B'),
    ('Answer: c', 'C'),
    ('The answer is D.', 'D'),
    ('The best answer is: A', 'A'),
    ('C. two dogs', 'C'),
    ('  D  ', 'D'),
    ('**A**', 'A'),
    ('Based on the video, the answer is C.', 'C'),       # official reads the B of "Based"
    ('a blue bicycle', 'B'),                              # option text without its letter
    ('Two dogs.', 'C'),
    ('I think it is (b)', 'B'),
    ('A or B', None),                                      # several letters
    ('A dog is running', None),                            # article, no letter, no option text
    ('none of the options', None),
    ('', None),
    ('E', None),                                          # out of range for 4 options
    ('The correct option is B because the man rides it.', 'B'),
    ('Option C', 'C'),
    ('answer: (d)', 'D'),
    ('A and C are both plausible', None),
    ('B. a blue bicycle\nC. two dogs', None),              # echoed options: ambiguous
    ('the man in the hat is shown', 'D'),
    ('It is a red car.', 'A'),
    ('Because the video shows a cat, C', 'C'),
    ('The answer is a red car', 'A'),
    ('[D]', 'D'),
    ('c.', 'C'),
    ('The answer is B, not C.', 'B'),
    ('Best option: (A)', 'A'),
    ('The video shows two dogs playing.', 'C'),
    ('Definitely B', 'B'),                                 # official reads the D of "Definitely"
    ('A', 'A'),
    ('Answer: A', 'A'),
]


def test_robust_table_is_large_enough():
    assert len(CASES) >= 25


@pytest.mark.parametrize("response,robust", CASES)
def test_robust(response, robust):
    assert parse_robust(response, OPTIONS) == robust
    assert parse(response, OPTIONS, "robust") == robust


def test_five_options_and_none_response():
    five = OPTIONS + ["nothing happens"]
    assert parse("E", five, "lvb") == "E"
    assert parse("E", five, "videomme") is None     # [ABCD] as released
    assert parse_robust("(e)", five) == "E"
    assert parse_robust("nothing happens", five) == "E"
    assert parse_robust(None, OPTIONS) is None


def test_long_answer_without_letter():
    text = "the person on the left is holding something that looks like it might be food"
    for rule in ("videomme", "lvb", "worldsense"):
        assert parse(text, OPTIONS, rule) is None


def test_robust_option_text_prefers_longest_containing():
    opts = ["dog", "a brown dog", "cat", "bird"]
    assert parse_robust("It is a brown dog.", opts) == "B"   # "dog" is inside "a brown dog"
    assert parse_robust("a dog and a cat", opts) is None       # two unrelated options


def test_bad_num_options():
    with pytest.raises(ValueError):
        parse_robust("A", [])


# KD-TAO/OmniZip@906029177bb3dc1b6e727d8182d9e832f89ccc54:eval/eval.py:evaluate_sample's extraction (resp_text =
# answers[0].strip(); the first of A-F that resp_text.upper().strip() starts with; else resp_text[0].upper()),
# run on these replies; its results, quoted
OMNIZIP_RELEASE = {"B": "B", " c.": "C", "b) two": "B", "The answer is C.": "T", "answer: D": "A", "": None,
                   "   ": None, "\nA\n": "A", "(B) violin": "(", "E": "E", "f": "F", "xyz": "X", "Δ": "Δ", "1": "1"}


@pytest.mark.parametrize("response", sorted(OMNIZIP_RELEASE))
def test_omnizip_rule_is_the_release(response):
    from algorithms.choice import parse_omnizip

    assert parse_omnizip(response) == OMNIZIP_RELEASE[response]
    assert parse(response, ["a", "b", "c", "d"], "omnizip") == OMNIZIP_RELEASE[response]
    assert "omnizip" in RULES
