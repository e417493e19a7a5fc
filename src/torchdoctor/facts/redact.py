"""Secrets never leave the machine: every redaction torchdoctor does is decided here, in one place.

Two rules, applied together:

* **by name**: a variable, flag or key whose name says it holds a secret (``HF_TOKEN``,
  ``MYSQL_PWD``, ``--db-password``, ``AccountKey=``, ``"api_key": ...``) loses its whole value.
  Names are split into words (``_``, ``-``, ``.``, camelCase), so ``MONKEY``,
  ``TOKENIZERS_PARALLELISM``, ``GIT_AUTHOR_NAME`` and ``PWD`` (the working directory) stay readable.
  In free text (logs, tracebacks) a few names are mostly code: ``key=`` without ``API``/``ACCESS``/...
  before it (``sorted(xs, key=...)``), ``signature=``, ``pass_number=``; their values go only when
  they look generated (letters and digits, 8+) or are query parameters (``?key=``); references such
  as ``token=None``, ``token=self.token``, ``--hf-token $HF_TOKEN`` are kept too;
* **by shape**, whatever the name: credentials in URLs (``scheme://user:pw@``), secret query
  parameters and ``key=value`` pairs inside a value (``?api_key=``, ``&sig=``, ``token=``,
  ``AccountKey=``), ``Authorization``/``Cookie`` headers, ``Bearer`` tokens, and well-known token
  formats: GitHub (``ghp_``, ``gho_``, ``ghs_``, ``ghu_``, ``ghr_``, ``github_pat_``), GitLab
  (``glpat-``), Slack (``xox[abprs]-``, ``hooks.slack.com/services/...``), Discord webhooks, AWS
  access key ids (``AKIA``/``ASIA``...), Hugging Face (``hf_``), OpenAI/Anthropic (``sk-``), Google
  API keys (``AIza``), npm and PyPI tokens, JWTs (``eyJ....eyJ....``) and PEM private keys.

:func:`redact_text` is the one function for free text (environment values, command lines,
``explain``'s output); :func:`redact_env` and :func:`redact_argv` add the name rule for structured
input. What is removed is replaced by :data:`REDACTED`; the text around it is kept.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence

REDACTED = "<redacted>"

#: Words that make a name secret when they are one of its words (``DB_PASSWORD``, ``apiKey``).
SECRET_WORDS = frozenset(
    {
        "TOKEN",
        "KEY",
        "SECRET",
        "SECRETS",
        "PASSWORD",
        "PASSWORDS",
        "PASSWD",
        "PASS",
        "PASSPHRASE",
        "CREDENTIAL",
        "CREDENTIALS",
        "CREDS",
        "AUTH",
        "AUTHORIZATION",
        "COOKIE",
        "COOKIES",
        "JWT",
        "WEBHOOK",
        "DSN",
        "APIKEY",
    }
)
#: ... or the end of one of its words, glued (``PGPASSWORD``, ``HFTOKEN``, ``APIKEY``; not ``MONKEY``).
SECRET_SUFFIXES = (
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "APIKEY",
    "ACCESSKEY",
    "SECRETKEY",
    "PRIVATEKEY",
    "ACCOUNTKEY",
    "AUTHKEY",
    "CREDENTIAL",
    "CREDENTIALS",
    "COOKIE",
    "WEBHOOK",
    "CONNECTIONSTRING",
    "CONNSTR",
)
#: Runs of words that together name a secret (``AZURE_STORAGE_CONNECTION_STRING``).
SECRET_PHRASES = (("CONNECTION", "STRING"), ("CONN", "STR"))
#: Query-parameter and pair names that hold a signature (Azure SAS ``sig=``, S3 ``X-Amz-Signature=``).
SECRET_PARAMS = frozenset({"SIG", "SIGNATURE", "SAS"})
#: Words before ``KEY`` that make it a credential for sure (``API_KEY``, ``AccountKey``); without one,
#: a ``key`` in free text is as likely code (``sort_key=``, ``dispatch_key=``): see :func:`redact_text`.
KEY_QUALIFIERS = frozenset(
    {
        "API",
        "ACCESS",
        "SECRET",
        "PRIVATE",
        "ACCOUNT",
        "AUTH",
        "CLIENT",
        "SIGNING",
        "ENCRYPTION",
        "MASTER",
        "LICENSE",
        "SERVICE",
        "SUBSCRIPTION",
        "SSH",
        "GPG",
        "PGP",
    }
)

_SPLIT = re.compile(r"[^A-Za-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def name_words(name: str) -> list[str]:
    """``"AZURE_STORAGE_ConnString"`` → ``["AZURE", "STORAGE", "CONN", "STRING"]``."""
    return [w.upper() for chunk in _SPLIT.split(name) for w in _CAMEL.split(chunk) if w]


#: A last word that makes the value a place, not the secret (``--key-file``, ``HF_TOKEN_PATH``).
LOCATION_WORDS = frozenset({"FILE", "FILES", "PATH", "PATHS", "DIR", "DIRS", "DIRECTORY", "KEYFILE", "KEYTAB"})


def _strength(words: list[str]) -> tuple[bool, bool]:
    """(strong, weak): whether words of the name surely make it secret, or only maybe: ``KEY``
    without a qualifier (``sort_key``), ``PASS`` not last (torch's ``pass_number``; ``DB_PASS`` is strong)."""
    if len(words) > 1 and words[-1] in LOCATION_WORDS:
        return False, False
    strong = weak = False
    for i, word in enumerate(words):
        if (word == "KEY" and not (i and words[i - 1] in KEY_QUALIFIERS)) or (word == "PASS" and i != len(words) - 1):
            weak = True
        elif (
            word in SECRET_WORDS
            or word.endswith(SECRET_SUFFIXES)
            or (word == "PWD" and len(words) > 1)  # MYSQL_PWD, DB_PWD; PWD alone is the working directory
            or any(tuple(words[i : i + len(p)]) == p for p in SECRET_PHRASES)
        ):
            strong = True
    return strong, weak


def is_secret_name(name: str) -> bool:
    """Whether a variable, flag or key of this name holds a secret (see the module doc)."""
    return any(_strength(name_words(name)))


def _pair_strength(name: str) -> tuple[bool, bool]:
    """:func:`_strength` of a name in a ``key=value`` pair or a query string, where a signature
    (``sig``, ``X-Amz-Signature``) is weakly secret too."""
    words = name_words(name)
    strong, weak = _strength(words)
    return strong, weak or bool(words and words[-1] in SECRET_PARAMS)


# -- by shape ---------------------------------------------------------------------------------------

_PEM = re.compile(r"-----BEGIN[A-Z ]{0,40} PRIVATE KEY-----.*?(?:-----END[A-Z ]{0,40} PRIVATE KEY-----|\Z)", re.DOTALL)
#: Whole tokens in well-known formats (the match is replaced whole).
TOKEN_FORMATS = (
    r"gh[pousr]_[A-Za-z0-9]{16,}",  # GitHub: classic PAT, OAuth, user-to-server, server, refresh
    r"github_pat_[A-Za-z0-9_]{20,}",  # GitHub fine-grained PAT
    r"glpat-[A-Za-z0-9_-]{20,}",  # GitLab
    r"xox[abprs]-[A-Za-z0-9-]{10,}",  # Slack
    r"(?:AKIA|ASIA)[A-Z0-9]{16}",  # AWS access key ids (long-term, temporary)
    r"hf_[A-Za-z0-9]{30,}",  # Hugging Face
    r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_-]{20,}",  # OpenAI (sk-, sk-proj-), Anthropic (sk-ant-)
    r"AIza[0-9A-Za-z_-]{35}",  # Google API keys
    r"npm_[A-Za-z0-9]{36}",  # npm
    r"pypi-AgE[A-Za-z0-9_-]{50,}",  # PyPI API tokens (macaroons)
    r"eyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*",  # JWT: header.payload.signature
)
_TOKENS = re.compile("|".join(TOKEN_FORMATS))
_WEBHOOKS = re.compile(
    r"(?P<keep>hooks\.slack\.com/(?:services|workflows|triggers)/|"
    r"discord(?:app)?\.com/api/webhooks/)[A-Za-z0-9/_-]+",
    re.IGNORECASE,
)
#: ``Bearer <token>``: not the key of a pair (``password=...``, left to the rules below).
_BEARER = re.compile(r"(?P<keep>\b[Bb]earer\s+)(?P<val>[A-Za-z0-9._~+/-]{8,}=*)(?![A-Za-z0-9=])")
#: ``scheme://user:pw@host``: up to the last ``@`` before the path, so a raw ``@`` in the password goes too.
_URL_USERINFO = re.compile(
    r"(?<![A-Za-z0-9+.-])(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]{0,30}://)(?P<userinfo>[^/?#\s<>]{1,256})@"
)
#: HTTP headers that carry credentials whole: everything after the colon goes.
_AUTH_HEADER = re.compile(
    r"(?P<keep>\b(?:proxy-)?authorization\s*:\s*|\b(?:set-)?cookie\s*:\s*)(?P<val>[^\s\"'<>][^\r\n\"'<>]*)",
    re.IGNORECASE,
)
# Keyed forms: a key (and its separator), then, only when the key is secret, its value. Each is a
# pair of patterns, so that the value of a key that is no secret is never read (the search goes on
# right after its separator, in linear time, and finds ``password=x`` inside ``A=0(password=x``).
_QUOTED_VALUE = r""""[^"\n]*"|'[^'\n]*'"""
#: ``X-Api-Key: v``: a header-like (dashed) secret name, a colon, a space, a value (NCCL's
#: ``host-name:pid:tid`` has no space).
_DASHED_HEADER = (
    re.compile(r"(?<![\w.-])(?P<key>[A-Za-z][A-Za-z0-9]*(?:-[A-Za-z0-9]+)+)[ \t]*:[ \t]+"),
    re.compile(r"[^\s\"',;<>]+"),
)
#: ``  password: v`` alone on a line (YAML, a printed Hydra/OmegaConf config): lowercase keys only,
#: so ``KeyError: ...``, ``Invalid token: ...`` and ``token: str or None`` are left alone.
_YAML_PAIR = (
    re.compile(r"(?m)^[ \t]*(?:-[ \t]+)?(?P<key>[a-z_][a-z0-9_.-]{0,63})[ \t]*:[ \t]+"),
    re.compile(rf"""(?m)(?:{_QUOTED_VALUE}|[^\s"'<>(\[]+)(?=[ \t]*$|[ \t]+\#.*$)"""),
)
#: ``"password": "v"`` / ``'api_key': 'v'`` (JSON, Python dict reprs; an unquoted value only when it
#: is a single word, not ``Style(...)`` or ``[``).
_QUOTED_PAIR = (
    re.compile(r"""(?P<q>["'])(?P<key>[A-Za-z_][\w.-]{0,63})(?P=q)\s*:\s*"""),
    re.compile(rf"""{_QUOTED_VALUE}|(?=(?P<word>[^\s,;}}\]<>"'(\[]+))(?P=word)(?![(\[])"""),
)
#: ``token=v``, ``?api_key=v&``, ``AccountKey=v;``, ``--hf-token=v``, ``password="v w"``.
_PAIR = (
    re.compile(r"(?<![\w.-])(?P<key>-{0,2}[A-Za-z_][\w.-]{0,63})="),
    re.compile(rf"""{_QUOTED_VALUE}|[^\s&;,"'<>(\[{{][^\s&;,"'<>]*"""),
)
#: ``--db-password v`` / ``-token v`` in a command line written out as text.
_FLAG = (
    re.compile(r"(?<![\w-])(?P<key>--?[A-Za-z][\w.-]{0,63})[ \t]+"),
    re.compile(rf"""{_QUOTED_VALUE}|(?!--)(?!-[A-Za-z](?![\w-]))[^\s"'<>]+"""),
)


#: Values that are no secret but code or a reference to one (source lines in a traceback, shell
#: lines, docstrings): ``token=token``, ``api_key=None``, ``password=self.password``,
#: ``authkey=process.authkey()``, ``key=lambda x: ...``, ``token: str``, ``--hf-token $HF_TOKEN``
#: (an upper-case variable only: ``$ecret1`` may well be a password), format placeholders
#: (``hash_key=%s``, ``token={}``), nothing to hide (``""``, ``***``).
_REFERENCE = re.compile(
    r"(?:None|True|False|null|true|false|lambda|(?:self|args|kwargs|cfg|config|os)\.[\w.\[(]*|"
    r"(?:str|bytes|int|float|bool|dict|list|tuple|set|object|Any|Optional|Union|Callable|Sequence|Mapping|Tensor)"
    r"(?:\[.*)?|"
    r"[A-Za-z_][\w.]*\([^()]*\)(?:\.[A-Za-z_]\w*(?:\([^()]*\))?)*|[A-Za-z_][\w.]*\(|"  # calls
    r"\$[A-Z_][A-Z0-9_]*|\$\{[A-Za-z_]\w*\}|%[-#0 +]?\d*(?:\.\d+)?[sdifrxXeEgGc]|%\(\w+\)[sdr]|\{[\w.!:]*\}|"
    r"[^A-Za-z0-9]*)"
)
#: Names in code, taken for a reference only after a weakly secret name (``key=sort_key``,
#: ``dispatch_key: DispatchKey``, ``pass_dict=B2B_GEMM_PASS``): after ``token=`` they may be the token.
_CODE_NAME = re.compile(
    r"(?=[a-z_.]*[_.])[a-z_]+(?:\.[a-z_]+)*|"  # sort_key, py.normalized_name
    r"(?:[A-Za-z_]\w*\.)*[A-Z][a-z]+(?:[A-Z][A-Za-z]*)+|(?:[A-Za-z_]\w*\.)+[A-Z][A-Za-z]*|"  # DispatchKey, _t.AuthType
    r"_?[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+|[A-Z]{2,}"
)  # B2B_GEMM_PASS, DEFAULT


def _is_reference(key: str, val: str, strong: bool = True) -> bool:
    bare = val.strip("\"'")
    if bare.startswith("-") and is_secret_name(bare.lstrip("-")):
        return True  # "X-Api-Key: --db-password v": a secret flag, whose value the flag rule removes
    return bare == REDACTED or any(
        b == key.lstrip("-") or _REFERENCE.fullmatch(b) or (not strong and _CODE_NAME.fullmatch(b))
        for b in (bare, bare.rstrip(")]},:;"))
    )


#: A weakly secret name (``key=``, ``sort_key=``, ``sig=``, ``signature=``, ``pass_number=``) is
#: mostly code in free text (``sorted(xs, key=...)``, ``np.vectorize(f, signature="(n)->()")``): its
#: value goes only when it looks generated, 8+ characters mixing letters and digits, or when it is a
#: query parameter (``?key=...``, ``&sig=...``).
_GENERATED = re.compile(r"(?=[^\d]*\d)(?=[^A-Za-z]*[A-Za-z])[A-Za-z0-9+/=_.~%-]{8,}")


def _keyed(text: str, key_at: int, key: str, val: str) -> bool:
    """Whether the value ``val`` of ``key`` (at ``key_at`` in ``text``) goes."""
    strong, weak = _pair_strength(key)
    strong = strong or (weak and key_at > 0 and text[key_at - 1] in "?&")  # a query parameter: ?key=, &sig=
    if not (strong or weak) or _is_reference(key, val, strong):
        return False
    return strong or bool(_GENERATED.fullmatch(val.strip("\"'").rstrip(")]},:;")))


def _keyed_spans(form: tuple[re.Pattern[str], re.Pattern[str]], text: str) -> list[tuple[int, int]]:
    """Where the values that go are (quotes kept)."""
    key_re, value_re = form
    spans: list[tuple[int, int]] = []
    scan = 0
    while (match := key_re.search(text, scan)) is not None:
        scan = match.end()
        if not any(_pair_strength(match.group("key"))):
            continue  # its value is not even read: the search goes on right after the separator
        value = value_re.match(text, match.end())
        if value is None:
            continue
        start, end = value.span()
        if _keyed(text, match.start("key"), match.group("key"), value.group()):
            if end - start >= 2 and text[start] == text[end - 1] and text[start] in "\"'":
                scan = end - 1  # the closing quote may open the next key: "a":"x"b":y
                start, end = start + 1, end - 1
            else:
                scan = end
                end = _unbalanced_closers(text, start, end)
            spans.append((start, end))
    return spans


def _unbalanced_closers(text: str, start: int, end: int) -> int:
    """``end`` without the closing brackets the value does not open: ``f(key=v)`` keeps its ``)``."""
    pairs = {")": "(", "]": "[", "}": "{"}
    while (
        end > start
        and (opener := pairs.get(text[end - 1])) is not None
        and text.count(text[end - 1], start, end) > text.count(opener, start, end)
    ):
        end -= 1
    return end


_KEYED = (_DASHED_HEADER, _YAML_PAIR, _QUOTED_PAIR, _PAIR, _FLAG)


def _bearer_spans(text: str) -> list[tuple[int, int]]:
    spans = []
    for match in _BEARER.finditer(text):
        val = match.group("val")
        if val.startswith("-") and is_secret_name(val.lstrip("-")):
            continue  # "Bearer --db-password v": the flag rule's, which removes v
        if val.endswith("=") and text.startswith(REDACTED, match.end()):
            continue  # "Bearer token=<redacted>", already done
        spans.append(match.span("val"))
    return spans


def secret_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of every secret in ``text``, all rules applied to the same text (so that no
    rule hides the key another one needs: in ``X-Api-Key: (--db-password v`` both values go)."""
    spans = [m.span() for m in _PEM.finditer(text)]
    spans += [m.span() for m in _TOKENS.finditer(text)]
    spans += [(m.end("keep"), m.end()) for m in _WEBHOOKS.finditer(text)]
    spans += [m.span("val") for m in _AUTH_HEADER.finditer(text)]
    spans += _bearer_spans(text)
    spans += [m.span("userinfo") for m in _URL_USERINFO.finditer(text)]
    for pattern in _KEYED:
        spans += _keyed_spans(pattern, text)
    return spans


def redact_text(text: str) -> str:
    """``text`` with every credential-shaped part replaced by :data:`REDACTED` (module doc);
    overlapping or touching parts become one.

    Idempotent, and a no-op on text without secrets: paths, hostnames, device lists,
    ``expandable_segments:True``, tracebacks and error messages come out as they went in.
    """
    if not text:
        return text
    merged: list[list[int]] = []
    for start, end in sorted(secret_spans(text)):
        if start == end:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    if not merged:
        return text
    out: list[str] = []
    pos = 0
    for start, end in merged:
        out += [text[pos:start], REDACTED]
        pos = end
    out.append(text[pos:])
    return "".join(out)


#: The former name of :func:`redact_text`.
redact_value = redact_text


def _is_flag_value(arg: str) -> bool:
    """Whether the argument after a secret flag is its value (not the next option)."""
    return not arg.startswith("--") and not re.fullmatch(r"-[A-Za-z]", arg)


def redact_argv(argv: Sequence[str]) -> str:
    """A process's command line as one string, with secret flags' values and secret shapes removed.

    Both forms of a secret flag are handled: ``--db-password VALUE`` (the next argument goes, even
    when it holds spaces) and ``--hf-token=VALUE``.
    """
    out: list[str] = []
    flag: tuple[bool, bool] = (False, False)  # the previous argument: a strongly / weakly secret flag
    for arg in argv:
        strong, weak = flag
        flag = _pair_strength(arg.lstrip("-")) if arg.startswith("-") and "=" not in arg else (False, False)
        if (strong or (weak and _GENERATED.fullmatch(arg))) and _is_flag_value(arg):
            out.append(REDACTED)
            flag = (False, False)
        else:
            out.append(redact_text(arg))
    return " ".join(out)


_GPU_ID = re.compile(r"\b(?:GPU|MIG)-[0-9A-Fa-f][0-9A-Fa-f/-]*")
GPU_ID_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def anonymise_gpu_ids(value: str) -> str:
    """Replace GPU/MIG UUIDs in a device list with stable stand-ins (prefix kept for readability)."""
    return _GPU_ID.sub(lambda m: f"{m.group(0)[:3]}-{anonymise(m.group(0))}", value)


def redact_env(env: Mapping[str, str], gpu_ids: bool = True) -> dict[str, str]:
    """Secrets by name replaced whole; secret shapes removed from every other value (URL
    credentials, tokens, ``key=`` pairs); GPU UUIDs anonymised when ``gpu_ids``."""
    out = {}
    for k, v in sorted(env.items()):
        if is_secret_name(k):
            out[k] = REDACTED
        elif gpu_ids and k in GPU_ID_VARIABLES:
            out[k] = redact_text(anonymise_gpu_ids(v))
        else:
            out[k] = redact_text(v)
    return out


def anonymise(identifier: str, salt: str = "torchdoctor") -> str:
    """A stable stand-in for a hardware identifier (GPU UUID, serial): same input, same output."""
    digest = hashlib.sha256(f"{salt}:{identifier}".encode()).hexdigest()[:12]
    return f"anon-{digest}"
