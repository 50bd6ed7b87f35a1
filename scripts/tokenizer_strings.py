"""Varied text for the tokenizer fixtures: a training corpus and test strings, generated from a seed (no downloads)."""
import random
import unicodedata

ENGLISH = """the of and to in is that it was for on are as with his they at be this have from or one had by word
but not what all were we when your can said there use an each which she do how their if will up other about out
many then them these so some her would make like him into time has look two more write go see number no way could
people my than first water been call who oil its now find long down day did get come made may part over new sound
take only little work know place year live me back give most very after thing our just name good sentence man
think say great where help through much before line right too mean old any same tell boy follow came want show
also around form three small set put end does another well large must big even such because turn here why ask
went men read need land different home us move try kind hand picture again change off play spell air away animal
house point page letter mother answer found study still learn should America world Monday London Paris Tokenizer
model kernel megakernel transformer attention GPU CUDA Hopper Python function return value""".split()

SCRIPTS = {
    "cyrillic": "привет мир Москва съешь ещё этих мягких французских булок да выпей чаю Ёлка ЖУРНАЛ".split(),
    "greek": "γειά σου κόσμε Αθήνα ψυχή ελληνικά Ωμέγα φιλοσοφία ΣΟΦΙΑ άλφα".split(),
    "arabic": "مرحبا بالعالم العربية كتاب السلام عليكم مُحَمَّد القاهرة ٢٠٢٤".split(),
    "hebrew": "שלום עולם עברית ספר ירושלים".split(),
    "devanagari": "नमस्ते दुनिया हिन्दी क्षत्रिय ज्ञान भारत संस्कृतम् १२३".split(),
    "thai": "สวัสดีชาวโลก ภาษาไทย กรุงเทพมหานคร ขอบคุณครับ".split(),
    "cjk": "你好 世界 中文 汉字 東京 漢字 我爱北京天安门 人工智能 龘".split(),
    "japanese": "こんにちは カタカナ ひらがな 日本語 ｶﾀｶﾅ トークナイザー".split(),
    "korean": "안녕하세요 세계 한국어 서울 \u1100\u1161\u11a8".split(),
    "other": "Բարեւ გამარჯობა வணக்கம் নমস্কার ሰላም សួស្តី ສະບາຍດີ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐌰𐌱𐌲 𒀀𒀁".split(),
    "latin": "naïve café façade Ångström Straße ÆØÅ œuvre İstanbul ıi ŞĞÜ Łódź ſtrong ﬁne".split(),
}

EMOJI = ["😀", "👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇺🇸", "🇯🇵", "❤️", "🧑🏿‍💻", "👩🏻‍❤️‍💋‍👨🏼", "1️⃣", "#️⃣",
         "🤷‍♀️", "🦀", "🐍", "✨", "🙂🙃", "👋🏿", "🫠", "©️", "™"]

CODE = [
    "def f(x):\n    return x**2\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "if (a && b || !c) { x->y = *p; }",
    "SELECT * FROM users WHERE id = 42;",
    '<div class="x">Hi</div>',
    'fn main() { println!("{}", 1); }',
    "x = [1, 2, 3]  # comment",
    '{"key": [1, 2.5, null], "nested": {"a": true}}',
    "#include <stdio.h>\nint main(void) { return 0; }\r\n",
    "a_b-c.d/e\\f",
    "https://example.com/path?q=1&r=two#frag",
    "user@example.org",
    r"^\s*(\d+)\.(\d+)$",
    "std::vector<int32_t> v{1, 2};",
    "    if x:\n        pass\n\n\n",
    "$ echo \"$HOME\" | grep -v '^#' >> out.txt 2>&1",
    "const f = async (a, b) => { await g(a ?? b); };",
    "<?xml version=\"1.0\"?>",
]

NUMBERS = ["0", "7", "42", "123", "1234", "12345", "3.14159", "1,234,567", "-42", "1e-9", "2024-06-01", "12:30:45",
           "٣٤٥", "१२३", "①②③", "Ⅻ", "½", "１２３", "0x1F600", "99.9%", "$1,000,000.00", "10^6", "𝟘𝟙𝟚"]

WHITESPACE = [" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n ", "\t\t", "\u00a0", "\u3000", "\u2003", "\r",
              "\x0b", "\x0c", "\u2028", "\u0085", "\u180e", " \t \n", "\n    "]

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'LL", "'D", "’s", "n't",
                "'ſ", "'x", "''"]

COMBINING = ["e\u0301", "a\u0308", "n\u0303", "o\u0302\u0323", "Z\u0324\u0354\u0367\u0311\u0313a\u0316\u032d",
             "\u0915\u094d\u0937", "\u0e01\u0e34\u0e48", "\u0301", "x\u20dd", "\u05e9\u05c1"]

# Special and added tokens of all fixture tokenizers, and near misses that must stay plain text.
ADDED = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
         "<|reserved_special_token_3|>", "<|python_tag|>", "<s>", "</s>", "<unk>", "<mask>", "@@user", "<sep>",
         "<<SYS>>", "<|endoftext|>", "<|eot_id", "<|", "|>", "<s", "</", "<|begin_of_text|", "<<SYS>", "<0x41>"]

MISC = ["▁", "▁▁hello", "\ufeff", "\ufffd", "\x00", "\x7f", "\x1b[0m", "\ue000", "\U0010fffd", "\u200b", "\u200d",
        "\u2060", "‘quoted’", "«guillemets»", "—", "…", "¿Qué?", "¡Hola!"]

SEPARATORS = [" "] * 12 + [", ", ". ", "\n", "  ", "\t", "", "-", " - ", "; ", "!\n", "?", "\r\n", ": "]


def fixed_strings():
    """Hand-picked cases: every pool entry alone, the empty string, and known-tricky combinations."""
    out = ["", " ", "a", "Hello world", "Hello, world!", " Hello", "  Hello", "Hello ", "hello\n", "I'm here",
           "don't stop", "they're, we've, I'll, he'd", "IT'S OK", "x's y'S", "a  b   c    d", "tabs\tand\ttabs",
           "line1\nline2\r\nline3\rline4", "\n\n\nfoo\n\n", "   leading", "trailing   ", " \t\n\r ",
           "<|begin_of_text|>Hello<|eot_id|>", "<s>hi</s>", "<s> hi </s>", "text <mask> more", "text<mask>more",
           "hi @@user there", "hi@@user", "a <sep>   b", "a<sep>b", "sys: <<SYS>> prompt", "x<<SYS>>y",
           "<|eot_id|><|eot_id|>", "<<|eot_id|>>", "1234567890", "12345678901234567890", "a1b22c333d4444",
           "👨‍👩‍👧‍👦👍🏽", "e\u0301 vs é", "ſ", "K \u212a", "İi", "ß ẞ", "ﬁ", "▁▁", "▁ ▁", " ▁x",
           "\u0085x\u0085", "a\u180eb", "a\u2028b\u2029c", "\u00a0\u00a0nbsp", "end.\u3000次"]
    for pool in [ENGLISH[:40], *SCRIPTS.values(), EMOJI, CODE, NUMBERS, WHITESPACE, CONTRACTIONS, COMBINING, ADDED,
                 MISC]:
        out.extend(pool)
    return out


def random_assigned_char(rng):
    """A random code point assigned in this Python's Unicode version (14.0 for Python 3.11, as PCRE2 10.42)."""
    while True:
        plane = rng.choice([0, 0, 0, 0, 1, 2])
        cp = plane * 0x10000 + rng.randrange(0x20 if plane == 0 else 0, 0x10000)
        if 0xD800 <= cp <= 0xDFFF:
            continue
        if unicodedata.category(chr(cp)) not in ("Cn", "Cs"):
            return chr(cp)


def word(rng):
    kind = rng.random()
    if kind < 0.45:
        w = rng.choice(ENGLISH)
        return w.capitalize() if rng.random() < 0.15 else w.upper() if rng.random() < 0.03 else w
    if kind < 0.70:
        return rng.choice(SCRIPTS[rng.choice(list(SCRIPTS))])
    if kind < 0.78:
        return rng.choice(NUMBERS) if rng.random() < 0.5 else str(rng.randrange(10 ** rng.randrange(1, 12)))
    if kind < 0.84:
        return rng.choice(EMOJI)
    if kind < 0.88:
        return rng.choice(ENGLISH) + rng.choice(CONTRACTIONS)
    if kind < 0.92:
        return rng.choice(COMBINING)
    if kind < 0.95:
        return rng.choice(MISC)
    return "".join(rng.choice("()[]{}<>.,;:!?\"'`~@#$%^&*-_=+|/\\") for _ in range(rng.randrange(1, 4)))


def sentence(rng, words):
    parts = []
    for _ in range(words):
        parts.append(word(rng))
        parts.append(rng.choice(SEPARATORS))
    return "".join(parts[:-1]) if rng.random() < 0.7 else "".join(parts)


def random_strings(rng, count, any_code_point=True):
    """count strings from generators weighted towards what tokenizers get wrong most easily. any_code_point=False
    leaves out strings of random code points (for a regex engine with another Unicode version than this Python)."""
    out = []
    generators = [
        (0.30, lambda: sentence(rng, rng.randrange(1, 15))),
        (0.08, lambda: " ".join(rng.choice(SCRIPTS[rng.choice(list(SCRIPTS))]) for _ in range(rng.randrange(1, 6)))),
        (0.08 if any_code_point else 0,
         lambda: "".join(random_assigned_char(rng) for _ in range(rng.randrange(1, 12)))),
        (0.08, lambda: "".join(rng.choice([*WHITESPACE, word(rng)]) for _ in range(rng.randrange(1, 8)))),
        (0.07, lambda: "".join(rng.choice(["", " ", ".", ",", "-", "x", "\n"]) + str(rng.randrange(10 ** 15))
                               [: rng.randrange(1, 16)] for _ in range(rng.randrange(1, 5)))),
        (0.08, lambda: rng.choice(CODE) + rng.choice(["", " ", "\n"]) + rng.choice(CODE)[: rng.randrange(0, 30)]),
        (0.12, lambda: sentence(rng, rng.randrange(0, 5)) + rng.choice(["", " ", "  ", "\n"]) + rng.choice(ADDED)
         + rng.choice(["", " ", "  ", "\n"]) + sentence(rng, rng.randrange(0, 5))),
        (0.06, lambda: "".join(rng.choice(EMOJI) + rng.choice(["", "", " ", "x"]) for _ in range(rng.randrange(1, 6)))),
        (0.05, lambda: " ".join(rng.choice(ENGLISH) + rng.choice(CONTRACTIONS) for _ in range(rng.randrange(1, 5)))),
        (0.04, lambda: "".join(rng.choice(["a", "e", "o", "क", "ก", " "]) + rng.choice(COMBINING)
                               for _ in range(rng.randrange(1, 6)))),
        (0.04, lambda: "".join(rng.choice(" \t\n\r\u00a0x.") for _ in range(rng.randrange(1, 20)))),
    ]
    weights = [w for w, _ in generators]
    while len(out) < count:
        out.append(rng.choices(generators, weights)[0][1]())
    return out


def long_strings(rng, count):
    return [sentence(rng, rng.randrange(60, 150)) for _ in range(count)]


def test_strings(seed=1, count=1800):
    """The committed test strings: the fixed cases, then random ones, then a few long ones; no duplicates."""
    rng = random.Random(seed)
    strings = fixed_strings() + random_strings(rng, count) + long_strings(rng, 4)
    return list(dict.fromkeys(strings))


def training_corpus(seed=1000, lines=30000):
    """Training text: mostly English-like sentences so that merges form words, with every other pool mixed in."""
    rng = random.Random(seed)
    corpus = [sentence(rng, rng.randrange(3, 25)) for _ in range(lines)]
    corpus += [rng.choice(CODE) for _ in range(lines // 20)]
    corpus += [" ".join(rng.choice(ENGLISH) for _ in range(12)) for _ in range(lines // 3)]
    return corpus
