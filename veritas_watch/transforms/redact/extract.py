"""Extractors shared by the rules: from a regex match to the secret span, its name and service."""

from __future__ import annotations

import base64
import binascii
import re
import urllib.parse

from veritas_watch.transforms.redact.base import (
    _PATH_RE,
    _REFERENCE_RE,
    _WORDLIKE_RE,
    Rule,
    Strength,
    _char_classes,
    _chosen_word_password,
    _fake_compound,
    _Hit,
    _is_placeholder,
    _is_wordish,
    _looks_like_code_or_path,
    _plausible,
    _random_printable,
    _symbol_password,
    shannon_entropy,
)
from veritas_watch.transforms.redact.names import (
    _GENERIC_KEY_NAMES,
    _SERVICES,
    _known_service_near,
    _secret_word,
    _service_before,
    _service_of_block,
    _service_of_target,
    is_secret_name,
    service_from_name,
)

# ---------------------------------------------------------------------------------------------
# Extractors


def _span_of(m: re.Match[str]) -> tuple[int, int]:
    if "secret" in m.re.groupindex and m.group("secret") is not None:
        return m.span("secret")
    return m.span()


def _extract_provider(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    start, end = _span_of(m)
    value = text[start:end]
    if rule.min_entropy and shannon_entropy(value) < rule.min_entropy:
        return None
    return _Hit(start, end)


def _extract_context(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    start, end = _span_of(m)
    value = text[start:end]
    before = text[max(0, start - rule.context_window) : start].lower()
    if not any(w in before for w in rule.context_words):
        return None
    if rule.min_entropy and shannon_entropy(value) < rule.min_entropy:
        return None
    # Random tokens mix classes; hashes, words and identifiers of the same length rarely do.
    if not any(c.isdigit() for c in value) or _is_wordish(value):
        return None
    hexish = all(c in "0123456789abcdef" for c in value.lower())
    if not hexish and _char_classes(value) < 3:
        return None
    return _Hit(start, end)


def _quoted_value(m: re.Match[str]) -> tuple[int, int, bool] | None:
    for group, quoted in (("qv", True), ("v", False)):
        if group in m.re.groupindex and m.group(group) is not None:
            s, e = m.span(group)
            return s, e, quoted
    return None


_TRAIL = ".,;:)]}>\"'`?。，；：）】》"


def _trim(text: str, start: int, end: int) -> tuple[int, int]:
    while end > start and text[end - 1] in _TRAIL:
        end -= 1
    return start, end


_WRAP_RE = re.compile(r"\r?\n")
_JOINED_WORDS_RE = re.compile(r"[A-Za-z]+(?:[^A-Za-z0-9][A-Za-z]+)+")
_QUERY_NEXT_RE = re.compile(r"&[A-Za-z_][A-Za-z0-9_.\-]*=")


_URL_HEAD_RE = re.compile(r"[a-z][a-z0-9+.\-]*://\S", re.I)


def _in_url_query(text: str, name_start: int) -> bool:
    """Is the name at `name_start` a parameter of a URL's query (`https://…?api_key=`, `…&password=`)?"""
    if text[name_start - 1 : name_start] not in ("?", "&"):
        return False
    token_start = max(text.rfind(c, max(0, name_start - 2048), name_start) for c in " \t\n\"'`<(") + 1
    head = _URL_HEAD_RE.search(text, token_start, name_start)
    return head is not None and "?" in text[head.end() : name_start]


def _extract_assignment(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    groups = m.groupdict()
    raw = groups.get("qv") if groups.get("qv") is not None else groups.get("v")
    if raw is None or raw.startswith("***") or "…" in raw:
        return None  # an OpenClaw mask (`KEY=***`, `sk-pro…HNzL`): found by the mask pass
    name = m.group("name")
    if rule.name == "secret_setter_call" and re.match(r"(?i)get(?:_|[A-Z]|$)", name):
        return None  # `keyring.get_password('system', 'username')`: a getter's arguments name what it gets
    in_query = _in_url_query(text, m.start("name"))
    # `"pass": "…"`: alone, `pass` is too ambiguous a name, but a quoted key of a JSON object or a config is one,
    # and so is a URL's query parameter (`?user=ops&pass=…`)
    quoted_pass = name.lower() == "pass" and (
        (bool(groups.get("nq")) and groups.get("qv") is not None) or in_query
    )
    if not is_secret_name(name) and not quoted_pass:
        return None
    if groups.get("op") == "," and not groups.get("nq"):
        return None  # `f(token, "x")`: only a quoted name pairs with the next argument
    if (groups.get("op") or "").startswith(("==", "!=")) and groups.get("qv") is None:
        return None  # `password == confirm`: a comparison with a variable; with a literal, a hard-coded secret
    code_op = (groups.get("op") or "").startswith(("==", "!=", "=>"))  # never prose: `:password => '...'`
    typed = bool(groups.get("typed"))  # `char secret[25] =`, `let password: &str =`: declared in code
    if (rule.name == "env_assignment" and name.lower() in _GENERIC_KEY_NAMES and not groups.get("nq") and not code_op
            and not typed):
        line_start = text.rfind("\n", 0, m.start()) + 1
        before = text[line_start : m.start()].rstrip(" \t$")
        if before and before[-1] not in "{[(,;-*#/|?&":  # (`?key=`, `&key=`: a query parameter)
            return None  # "here is the TokenMall key: ...": prose, which the cue rules read (and name)
    qv = _quoted_value(m)
    if qv is None:
        return None
    start, end, quoted = qv
    if quoted:
        end = _escaped_string_end(m, text, end)
        inner = _INNER_LITERAL_RE.fullmatch(text, start, end)
        if inner:  # Gradle `buildConfigField "String", "API_KEY", "\"…\""`: a Java literal in a string
            start, end = inner.span("body")
    setting = rule.name == "env_line"  # a whole `NAME=value` line: the value runs to the next space
    if setting:
        if text[m.start("name") - 1 : m.start("name")] == '"':
            close = _JSON_CLOSE_RE.search(text, start, end)  # a `.env` line inside a JSON string
            end = close.start() if close else end
    elif not quoted:
        if text[m.start("name") - 1 : m.start("name")] in ("?", "&"):
            query = _QUERY_NEXT_RE.search(text, start, end)  # ?api_key=...&format=json
            if query:
                end = query.start()
        start, end = _trim(text, start, end)
    if end <= start:
        return None
    value = text[start:end]
    last = re.split(r"[.:]", name)[-1]
    env_style = last.isupper()  # DEEPSEEK_API_KEY: a deliberate variable, trusted more than code names
    word = _secret_word(name)
    strength: Strength
    if word == "password":
        strength = "password_env" if env_style else "password"
    elif word == "key" and not env_style and text[m.start("name") - 1 : m.start("name")] not in ("?", "&"):
        strength = "weak"  # (`?key=` / `&key=` in a URL: an API key parameter, as Google's APIs take it)
    else:
        strength = "token_env" if env_style else "token"
    unwrapped = _WRAP_RE.sub("", value) if quoted else value
    # a qualified key name (`api_key`, `private_key`) vouches for a chosen value in a string literal too
    vouched = word == "password" or "secret" in name.lower() or (quoted and _QUALIFIED_KEY_RE.search(name) is not None)
    # a word-built password under an explicit password or secret name, where it is set off as a value:
    # a string literal, an env-style setting, a YAML/INI line (`password: centipede`), an XML element
    # ... and a URL's query parameter, which is a name and its value whatever the text around the URL
    as_value = (quoted or env_style or setting or in_query or rule.name == "xml_secret_element"
                or _setting_line(m, text)) and (
        groups.get("op") != ","  # `("secret", "private")`: a list of names, not a name and its value
    )
    named = word == "password" or _NAME_ENDS_SECRET_RE.search(last) is not None
    if not (
        _plausible(unwrapped, strength)
        # an env-style name (`GENERIC_TOKEN="Prestigitariu$"`) is deliberate enough for a word with a
        # symbol in it, unless it is words joined by one (`read+write`: scopes)
        or ((vouched or (env_style and not _JOINED_WORDS_RE.fullmatch(unwrapped))) and _symbol_password(unwrapped))
        or _random_printable(unwrapped, min_classes=3 if vouched else 4)
        or (named and as_value and _chosen_word_password(unwrapped))
        # a key in a URL is percent-encoded or base64 with its padding (`?apikey=hHOfvH+onByaUvZ==`), mixes
        # fewer character classes than one in prose, and the parameter's name vouches for it
        or (in_query and _random_printable(unwrapped, min_classes=2))
        or (in_query and word == "password" and len(unwrapped) >= 8 and _char_classes(unwrapped) >= 3
            and not _is_placeholder(unwrapped) and not _REFERENCE_RE.search(unwrapped))
    ):
        return None
    service = service_from_name(last, known_only=True) or _known_service_near(text, m.start(), window=60)
    return _Hit(
        start,
        end,
        # a bare `PASSWORD=` / `token:` is named as its cue would be ("password"), a variable as written
        key_name=last.lower() if last.lower() in _GENERIC_KEY_NAMES else last,
        service=service or service_from_name(last),
        value=unwrapped if unwrapped != value else None,
    )


_JSON_CLOSE_RE = re.compile(r'(?<!\\)"')
_STRING_BODY_RE = re.compile(r'(?:[^"\\\n]|\\.)*"')
_INNER_LITERAL_RE = re.compile(r'(?P<iq>\\?["\'])(?P<body>[^"\'\\\n]{6,})(?P=iq)')


def _escaped_string_end(m: re.Match[str], text: str, end: int) -> int:
    """`"jwt_secret": "7`D\\"}/vY..."`: a double-quoted value stopped at an escaped quote `\\"` while its
    opening quote was not escaped (the `\\"` closes only a value opened by `\\"`, as in JSON inside a
    string); the value runs to the quote that closes the string."""
    if m.group("q") != '"' or text[m.start("q") - 1 : m.start("q")] == "\\":
        return end
    body = _STRING_BODY_RE.match(text, m.start("qv"))
    return max(end, body.end() - 1) if body else end


_NAME_ENDS_SECRET_RE = re.compile(r"(?i)secret$")
_QUALIFIED_KEY_RE = re.compile(r"(?i)(?:api|private|access|secret)[_\-]?key")


def _setting_line(m: re.Match[str], text: str) -> bool:
    """`password: centipede` / `password = open_sesame` alone on its line (YAML, INI, properties)."""
    line_start = text.rfind("\n", 0, m.start("name")) + 1
    if text[line_start : m.start("name")].strip(" \t-") or m.group("nq"):
        return False
    end = m.end()
    line_end = text.find("\n", end)
    if text[end : line_end if line_end >= 0 else len(text)].strip():
        return False
    op = m.groupdict().get("op") or ""
    if op == "=":
        return _INI_SECTION_RE.search(text, 0, line_start) is not None  # INI; in code it is a variable
    return op == ":" and (m.group("v") or "").lower() not in _TYPE_NAMES  # YAML, not `password: bytes`


_INI_SECTION_RE = re.compile(r"(?m)^[ \t]*\[[A-Za-z0-9_.\- ]{1,80}\][ \t]*$")
_TYPE_NAMES = frozenset({"bytes", "float", "list", "dict", "text", "char", "varchar", "secretstr", "optional", "union"})


def _extract_cli_flag(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    qv = _quoted_value(m)
    if qv is None:
        return None
    start, end, _quoted = qv
    value = text[start:end]
    flag = m.group("name").lower()
    strength: Strength = "password" if "pass" in flag else "token"
    if not _plausible(value, strength, quoted=False):
        return None
    return _Hit(start, end, key_name="--" + flag, service=_service_before(text, m.start()))


def _base64_text(value: str) -> str:
    """`value` decoded as base64 text, or "" if it is not."""
    try:
        return base64.b64decode(value + "=" * (-len(value) % 4), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return ""


def _extract_auth_header(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    start, end = m.span("secret")
    value = text[start:end]
    scheme = (m.group("scheme") or "").lower()
    if scheme == "basic":
        decoded = _base64_text(value)
        if ":" not in decoded and not _plausible(value, "token"):
            return None
        if len(value) < 8 or _is_placeholder(value):
            return None
    elif not _plausible(value, "token"):
        return None
    return _Hit(start, end, key_name="Authorization", service=_known_service_near(text, m.start()))


def _extract_basic_auth(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    """A Docker config's `"auth": "<base64 of user:password>"`: a credential when it decodes to one."""
    start, end = m.span("secret")
    user, colon, password = _base64_text(text[start:end]).partition(":")
    if not colon or not user or len(password) < 3 or not password.isprintable() or _is_placeholder(password):
        return None
    return _Hit(start, end, key_name="auth", service=_known_service_near(text, m.start()))


def _extract_url_credentials(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    start, end = m.span("secret")
    value = text[start:end]
    user = m.group("user")
    if len(value) < 3 or _is_placeholder(value) or _REFERENCE_RE.search(value):
        return None
    if value.lower() in ("pass", "pw", "passwd", "pwd") or (
        user.lower() in ("user", "username") and value.lower() in ("pass", "password", "secret")
    ):
        return None
    if re.match(r"\d{1,5}(?:[,/]|$)", value):
        return None  # host:port lists ("https://a.com:123,b:456@..."), not a password
    if "/" in value and (_PATH_RE.fullmatch(value) or not _plausible(value.replace("/", ""), "password")):
        return None  # `https://host:8443/docs/v2@latest`: a path; `ab/cd9Xk2Lm` is a password with a slash
    decoded = urllib.parse.unquote(value)
    if _WORDLIKE_RE.fullmatch(decoded) and (len(decoded) <= 5 or " " in decoded or _fake_compound(decoded)):
        return None  # documentation URLs: "github://org:repo@", "https://jo:a%20secret@"
    scheme = (m.group("scheme") or "mysql").lower().split("+")[0]  # no scheme: a Go MySQL DSN
    host = m.group("host")
    service = _SERVICES.get(scheme) or _SERVICES.get(scheme.rstrip("s")) or host
    if token_like(user):
        # `redis://<key>:<password>@host`: the user part is a key too; both are the credential, neither a name
        return _Hit(m.start("user"), end, key_name=f"key@{host}", service=service, value=f"{user}:{value}")
    # the span takes the user too (`deploy:Qo3j9V#98TAgdB6`): the vault keeps the password
    return _Hit(m.start("user"), end, key_name=f"{user}@{host}", service=service, value=value)


_NAME_PIECE_RE = re.compile(r"[A-Za-z]+|[A-Za-z0-9]{1,4}")


def token_like(word: str) -> bool:
    """A word that is a key itself (`sk_live_…`, `AGE-SECRET-KEY-1…`, a random token), not a name: a secret's
    name (`TF_VAR_cloudflare_api_token`) is made of words and short pieces only."""
    if not _plausible(word, "token"):
        return False
    return not is_secret_name(word) or not all(_NAME_PIECE_RE.fullmatch(p) for p in re.split(r"[_.\-]", word) if p)


# The tools that take `-u user:password` (`date -u +%Y-%m-%dT%H:%M:%SZ` is another `-u`); a command may
# run over `\`-continued lines
_USER_FLAG_TOOLS_RE = re.compile(r"(?i)(?:^|[\s;|&(`$])(?:curl|curlie|wget|http|https|xh|lftp)[ \t]")


_COMMAND_END_RE = re.compile(r"(?<!\\)\n")
_URL_HOST_RE = re.compile(r"https?://(?P<host>[A-Za-z0-9.\-]{1,253})")


def _service_of_command(text: str, start: int, end: int) -> str | None:
    r"""The provider a command names before its `-u` (`mailgun: curl -u …`) or by the host it calls
    (`curl -u KEY: https://api.mailgun.net/…`), the rest of the command (`\`-continued lines) included."""
    service = _known_service_near(text, start)
    if service is None:
        stop = _COMMAND_END_RE.search(text, end, end + 400)
        line_start = max(text.rfind("\n", 0, start) + 1, start - 400)
        url = _URL_HOST_RE.search(text, line_start, stop.start() if stop else end + 400)
        if url is not None:
            service = _known_service_near(url["host"], len(url["host"]))
    return service


def _key_as_user(user: str) -> bool:
    """`-u hHOfvH+onByaUvZ==:`, `-u be8dfd.da8a689a46edc282:`: with an empty password the user is the key by
    the convention the flag is used with; long, not made of words, no address, mixed classes, spread."""
    return (
        len(user) >= 16 and "@" not in user and _char_classes(user) >= 2 and shannon_entropy(user) >= 3.2
        and not _is_wordish(user) and not _is_placeholder(user) and not _REFERENCE_RE.search(user)
        and not _looks_like_code_or_path(user)
    )


def _extract_curl_user(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    if _USER_FLAG_TOOLS_RE.search(text, max(0, m.start() - 400), m.start()) is None:
        return None
    user = m.group("wuser") if m.group("wq") else (m.group("quser") or m.group("user") or "")
    password = m.group("wpass") if m.group("wq") else (m.group("qpass") or m.group("pass") or "")
    user, password = user.strip("\"'"), password.strip("\"'")
    start, end = m.span("arg")
    if m.group("pass") is not None and m.group("pass")[:1] not in "\"'":
        end = start + len(text[start:end].rstrip(_TRAIL))
        password = password.rstrip(_TRAIL)
    if password and token_like(user) and (len(password) < 3 or _is_placeholder(password)):
        password = ""  # `-u KEY:X` (Freshdesk's way): a stand-in password, the key is the user
    if password:
        if len(password) < 3 or _is_placeholder(password) or _REFERENCE_RE.search(password):
            return None
        if password.startswith("$") and not any(c.isdigit() for c in password):
            return None  # `-u user:$TOKEN`
    elif not (_plausible(user, "token") or _key_as_user(user)):
        return None  # `-u sk_test_...:` (an API key as the user, no password) must look like a key
    service = _service_of_command(text, m.start(), m.end())  # (only for a match kept: it reads the whole command)
    if not password or token_like(user):
        # `-u KEY:` (Stripe's, Mailgun's way) or `-u KEY:PW`: the user is a key, the whole argument the credential
        return _Hit(start, end, key_name="key (curl -u)", service=service,
                    value=f"{user}:{password}" if password else user)
    # `-u deploy:PW`: the user names the login, the vault keeps the password
    return _Hit(start, end, key_name=f"{user or '-'} (curl -u)", service=service, value=password)


_OPEN_QUOTES = {"`": "`", '"': '"', "'": "'", "“": "”", "‘": "’", "「": "」", "『": "』", "(": ")"}
# A quoted passphrase may hold spaces (`password is "blue sky 42"`): its closing quote on the same line, near.
_QUOTED_PHRASE_MAX = 64


_PROSE_SEP_RE = re.compile(r"(?i)\b(?:is|was|are|be|to)\b|[是为為\u4e00-\u9fff]")


def _cue_value(m: re.Match[str], text: str) -> tuple[int, int, bool]:
    """The value after a cue, and whether it was set off as a value in prose."""
    start, end = m.span("value")
    q = m.group("q") or ""
    prose = bool(_PROSE_SEP_RE.search(m.group("sep")) or not m.group("cue").isascii() or q not in ("'", '"'))
    quoted = False
    if q:
        close = _OPEN_QUOTES.get(q, q)
        idx = text.find(close, start, end + 1) if close.isascii() else -1
        if close.isascii() and idx < 0 and q in "\"'" and text[end:end + 1] == " ":
            line_end = text.find("\n", start)
            limit = min(start + _QUOTED_PHRASE_MAX, line_end if line_end >= 0 else len(text))
            phrase_end = text.find(close, start, limit)
            if phrase_end > start:
                idx = phrase_end
        if close.isascii() and idx >= 0:
            end = idx
            quoted = True
        elif not close.isascii():
            quoted = True
        elif q == "`":
            start -= 1  # `密码：`123QWERasdf（…`: a backtick nothing closes opens the value itself
    if not quoted:
        field = _NEXT_FIELD_RE.search(text, start, end + 48)  # `Password=x;Initial Catalog=...`: the next field
        if field and field.start() < end:
            end = field.start()
        start, end = _trim(text, start, end)
    return start, end, quoted and prose


_NEXT_FIELD_RE = re.compile(r";[ \t]*[A-Za-z][A-Za-z _]{1,40}=")


def _keep_random_tail(m: re.Match[str], text: str, start: int, end: int) -> tuple[int, int]:
    """Trimming took trailing `?`, `.` or `)` off a value: where the untrimmed value is a random printable
    string (`1qay@WXS????`, `X)\\ivltp(G(dcPgK#)`), keep it whole. Hiding a full stop that was only
    punctuation costs nothing; leaving a generated secret's last characters behind leaks them."""
    raw_end = m.end("value")
    if end >= raw_end or m.group("q") or text[end:raw_end].strip(".?!)"):
        return start, end  # only stops, marks and a paren: a closing quote or bracket belongs to the text
    full = text[start:raw_end]
    if _random_printable(full) or _symbol_password(full):
        return start, raw_end
    # a run of marks no sentence ends with (`????`) after a random value is the value's own
    tail = text[end:raw_end]
    run = len(tail) >= 2 and not tail.strip("?!")
    trimmed = text[start:end]
    return (start, raw_end) if run and (_random_printable(trimmed) or _symbol_password(trimmed)) else (start, end)


_STRONG_KEY_QUALIFIERS = ("api", "access", "secret", "private", "auth", "app", "client", "bot", "license")


_NEXT_LINE_ASSIGNMENT_RE = re.compile(r"[\w.\-\[\]]+[ \t]*(?:[:=]|$)")


def _cue_crosses_into_assignment(m: re.Match[str], text: str, start: int) -> bool:
    """`snowflake.password=` then a newline then `jdbc.snowflake.url=...`: the next line is the next
    setting (the value was left empty), not the value."""
    if "\n" not in text[m.end("sep") : start]:
        return False
    nxt = _NEXT_LINE_ASSIGNMENT_RE.match(text, start)
    if nxt is None:
        return False
    name = nxt.group().rstrip(" \t:=")
    # a setting's name is words (`jdbc.snowflake.url`, `LOG_LEVEL`); `a9RU2RpK=at&gh` is a value
    return not name or any(c in name for c in "._-[") or _is_wordish(name) or name.isupper()


# `correct-horse-battery-staple`: four or more words joined by one separator, as passphrase generators write
# them (only after a password cue: the cue vouches, the shape says it is no ordinary word)
_PASSPHRASE_RE = re.compile(r"[A-Za-z]{3,}(?P<j>[-_.])[A-Za-z]{3,}(?:(?P=j)[A-Za-z]{3,}){2,}")

_CJK_RE = re.compile(r"[\u3000-\u30ff\u4e00-\u9fff\uff00-\uffef]")  # CJK punctuation, kana, ideographs


def _cjk_set_off(m: re.Match[str], text: str, end: int) -> bool:
    """`密码：blooberry，帮我…`, `password 是 goodspec 别弄丢了`: an ASCII value that a Chinese cue or
    separator introduces and Chinese text closes is set off as a value, as quotes would set it off."""
    if not (_CJK_RE.search(m.group("sep")) or _CJK_RE.search(m.group("cue"))):
        return False
    after = text[end : end + 3].lstrip(" \t")
    return not after or after[0] in "\n" or _CJK_RE.match(after) is not None


def _alone_on_next_line(m: re.Match[str], text: str, start: int, end: int) -> bool:
    """`Http token:` then the value as the whole next line: set off by the layout, as quotes would."""
    line_end = text.find("\n", end)
    return "\n" in text[m.end("cue") : start] and not text[end : line_end if line_end >= 0 else len(text)].strip()


# A word told as the password in prose ("my password is sunshine", "the wifi password is bluewhale."): the cue
# vouches for it where it ends the clause; what ends a clause after "password is" is otherwise a predicate
# ("wrong", "required", "case-sensitive", "encrypted"), told apart by the word or its ending.
_CLAUSE_END_RE = re.compile(r"[.!?,;:)\]]*(?:\s*$|\s*\n|[ \t]+(?:and|but|so|btw|or|if|when|lol|thanks)\b|[，。！？、])")
_PREDICATE_END_RE = re.compile(
    r"(?:ed|ing|ive|ble|ous|ful|less|al|ic|ent|ant|ure|ory|ary|ly|ion|ity|ness|ment|ise|ize|en|est)$")
_PREDICATES = frozenset((
    "correct", "wrong", "strong", "secret", "private", "public", "random", "default", "simple", "length", "invalid",
    "something", "anything", "nothing", "everything", "another", "unknown", "written", "shown", "chosen", "please",
    "inside", "outside", "attached", "blank", "empty", "null", "none", "false", "true", "undefined", "unset", "okay",
    "great", "better", "worse", "longer", "shorter", "stronger", "weaker", "easier", "harder", "simpler", "safer",
    "already", "there", "where", "whatever", "plaintext", "cleartext", "weak", "short", "complex", "secure",
    "expired", "unchanged", "mine", "yours", "theirs", "below", "above", "here", "same", "fine", "good", "hard",
))


def _told_word(value: str, text: str, stop: int) -> bool:
    """A password given as a word (or a word with digits) in prose, ending its clause."""
    if not 6 <= len(value) <= 40 or not value.isascii() or not re.fullmatch(r"[A-Za-z0-9!@#$%^&*+-]+", value):
        return False
    if _CLAUSE_END_RE.match(text, stop) is None or _is_placeholder(value) or _REFERENCE_RE.search(value):
        return False
    word = value.lower().strip("!.")
    if word in _PREDICATES or "-" in word or (word.isalpha() and _PREDICATE_END_RE.search(word)):
        return False  # `case-sensitive`, `required`, `incorrect`: said of the password, not the password
    return not _looks_like_code_or_path(value) and not value.isdigit()


def _extract_password_cue(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    start, end, quoted = _cue_value(m, text)
    if _cue_crosses_into_assignment(m, text, start):
        return None
    start, end = _keep_random_tail(m, text, start, end)

    def password_like(stop: int) -> bool:
        value = text[start:stop]
        if " " in value:  # only inside quotes, told (`password: 'my long passphrase here'`; in code, `=`, a string)
            closed = bool(m.group("q")) and text[stop:stop + 1] == _OPEN_QUOTES.get(m.group("q"), "")
            closed = closed and "=" not in m.group("sep")
            return closed and len(value) >= 8 and len(value.split()) <= 8 and not _is_placeholder(value)
        return (
            _plausible(value, "password", quoted=quoted)
            or _symbol_password(value)
            or _random_printable(value)
            or _PASSPHRASE_RE.fullmatch(value) is not None
            or (m.group("cue").isascii() and "=" not in m.group("sep") and _told_word(value, text, stop))
            # a word is a password where the layout sets it off: in Chinese, or alone on the next line
            or ((_cjk_set_off(m, text, stop) or _alone_on_next_line(m, text, start, stop))
                and _chosen_word_password(value))
        )

    raw_end = m.end("value")
    # an ASCII `.` or `?` glued to the Chinese text after it is no English full stop: the value's own
    # (`密码：e_Tagju.（旧的…`), where the value is a password with it
    if end < raw_end and not text[end:raw_end].strip(".?") and _CJK_RE.match(text, raw_end) and password_like(raw_end):
        end = raw_end
    elif not password_like(end):
        return None
    service = _service_of_target(m.group("target")) or _service_before(text, m.start("cue"))
    return _Hit(start, end, key_name=m.group("cue").lower(), service=service)


def _extract_token_cue(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    start, end, quoted = _cue_value(m, text)
    if _cue_crosses_into_assignment(m, text, start):
        return None
    start, end = _keep_random_tail(m, text, start, end)
    value = text[start:end]
    cue = m.group("cue").lower()
    secret_cue = "secret" in cue or cue in ("密钥", "秘钥", "私钥", "秘密鍵", "シークレットキー")
    # a word with a symbol in it is a chosen secret under a secret cue, or under any cue where the value
    # is set off (`token is `Prestigitariu$``, `token 是 Prestigitariu$ 别…`, alone on the line after
    # `token:`); words joined by a symbol after a token cue are its scopes (`read+write`)
    symbol_password = _symbol_password(value) and (
        secret_cue
        or (
            (quoted or _cjk_set_off(m, text, end) or _alone_on_next_line(m, text, start, end))
            and not _JOINED_WORDS_RE.fullmatch(value)
        )
    )
    if symbol_password or (secret_cue and _random_printable(value)) or _random_printable(
        value, min_classes=4
    ) or (secret_cue and _cjk_set_off(m, text, end) and _chosen_word_password(value)) or (
        # "the Azure token: EAyw:F@vU'i~z@GJ": a provider named before the cue vouches like a secret cue
        _random_printable(value) and _known_service_near(text, m.start("cue"), window=48) is not None
    ):
        service = _service_of_target(m.group("target")) or _service_before(text, m.start("cue"))
        return _Hit(start, end, key_name=re.sub(r"[\s_-]+", " ", cue), service=service)
    if not _plausible(value, "token", quoted=quoted):
        return None  # (the weakest test first: naming the service costs more)
    service = _service_of_target(m.group("target")) or _service_before(text, m.start("cue"))
    bare_key = re.fullmatch(r"keys?", cue) is not None
    if bare_key and service is None:
        service = _service_of_block(text, m.start("cue"))
    qualified = any(cue.startswith(q) for q in _STRONG_KEY_QUALIFIERS) or service is not None
    strength: Strength = "weak" if bare_key and not qualified else "token"
    if not _plausible(value, strength, quoted=quoted):
        return None
    return _Hit(start, end, key_name=re.sub(r"[\s_-]+", " ", cue), service=service)


