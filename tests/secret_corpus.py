"""A generated corpus of chat messages carrying secrets, for recall and leak tests.

Each `SecretKind` makes random values in one provider's public key format (or one generic chat
form: passwords, opaque tokens after a cue, URL credentials, auth headers). `generate_corpus`
embeds them in English and Chinese prose, code blocks, JSON, `.env` dumps, URLs, curl commands
and backticks, and records exactly where each planted value sits. Values are random, never real.
"""

from __future__ import annotations

import base64
import json
import random
import string
from collections.abc import Callable
from dataclasses import dataclass

ALNUM = string.ascii_letters + string.digits
LOWER_ALNUM = string.ascii_lowercase + string.digits
UPPER_ALNUM = string.ascii_uppercase + string.digits
HEX = "0123456789abcdef"
B64URL = ALNUM + "-_"
B64 = ALNUM + "+/"
BECH32 = "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L"


def rand(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def rand_mixed(rng: random.Random, alphabet: str, n: int) -> str:
    """Random string guaranteed to hold a digit and a letter (real keys virtually always do)."""
    while True:
        s = rand(rng, alphabet, n)
        if any(c.isdigit() for c in s) and any(c.isalpha() for c in s):
            return s


@dataclass(frozen=True)
class SecretKind:
    """One format of secret. `rule` is the rule expected to report it."""

    rule: str
    service: str  # how a user names the service in prose
    env_name: str  # the variable name a user would give it
    make: Callable[[random.Random], str]
    prefix: str = ""  # the fixed leading part, for near-miss samples
    provider: bool = True  # recognisable by format alone, without any cue
    context: str = ""  # a word that must precede it (context rules)
    multiline: bool = False
    wrap: Callable[[str], str] | None = None  # natural surroundings (URL around a SAS signature)
    password: bool = False
    url_safe: bool = True  # may be placed inside a URL's userinfo
    misses: tuple[str, ...] = ()  # extra look-alikes that are not secrets


def _key_body(rng: random.Random) -> str:
    """An OpenSSH private key's base64 body pasted without its BEGIN/END lines."""
    raw = b"openssh-key-v1\x00" + bytes(rng.randrange(256) for _ in range(600))
    body = base64.b64encode(raw).decode()
    return "\n".join(body[i : i + 70] for i in range(0, len(body), 70))


def _pem(rng: random.Random, label: str, body_len: int = 1200) -> str:
    body = rand(rng, B64, body_len)
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return f"-----BEGIN {label}-----\n" + "\n".join(lines) + f"\n-----END {label}-----"


def _jwt(rng: random.Random) -> str:
    def seg(obj: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj, separators=(",", ":")).encode()).decode().rstrip("=")

    header = seg({"alg": rng.choice(["HS256", "RS256", "ES256"]), "typ": "JWT"})
    payload = seg(
        {
            "sub": rand(rng, LOWER_ALNUM, 12),
            "iat": rng.randrange(1_600_000_000, 1_800_000_000),
            "role": rng.choice(["service_role", "anon", "admin", "user"]),
        }
    )
    return f"{header}.{payload}.{rand(rng, B64URL, 43)}"


def _password(rng: random.Random) -> str:
    words = [
        "Sunshine",
        "dragon",
        "Monkey",
        "shadow",
        "Tiger",
        "panda",
        "Lucky",
        "river",
        "Maple",
        "orange",
        "falcon",
        "Winter",
        "coffee",
        "Rocket",
        "summer",
    ]
    pinyin = ["woaini", "zhangwei", "wangfang", "lixiao", "xiaoming", "nihao", "tiantian", "baobao"]
    style = rng.randrange(7)
    if style == 0:
        return rng.choice(words) + rng.choice("@#!*&_-") + str(rng.randrange(10, 9999))
    if style == 1:
        return rng.choice(pinyin) + str(rng.randrange(100, 999999))
    if style == 2:
        return rand_mixed(rng, ALNUM + "!@#*&^", rng.randrange(10, 18)).lstrip("!@#*&^") + "9"
    if style == 3:
        return "".join(rng.choice(UPPER_ALNUM) for _ in range(2)) + rand_mixed(rng, LOWER_ALNUM, 8) + rng.choice("!@#")
    if style == 4:
        return str(rng.randrange(10_000_000, 99_999_999))  # Wi-Fi style digits
    if style == 5:
        return rng.choice(words).capitalize() + str(rng.randrange(1990, 2030)) + rng.choice("!#*")
    return "Aa" + str(rng.randrange(100000, 999999)) + rng.choice("!@#")


def _url_password(rng: random.Random) -> str:
    return rand_mixed(rng, ALNUM, rng.randrange(10, 20)) + rng.choice(["!", "_", "-", "*", ""]) + str(rng.randrange(10))


def _opaque(rng: random.Random) -> str:
    """A key of a format no rule knows: what 'here is the TokenMall key: ...' carries."""
    style = rng.randrange(5)
    if style == 0:
        return "tm-" + rand_mixed(rng, ALNUM, 40)
    if style == 1:
        return rand_mixed(rng, ALNUM, 32)
    if style == 2:
        return rand_mixed(rng, HEX, 40)
    if style == 3:
        return "key_" + rand_mixed(rng, B64URL, 36).strip("-_")
    return rand_mixed(rng, ALNUM, 24) + "." + rand_mixed(rng, ALNUM, 20)


def _uuid(rng: random.Random) -> str:
    return "-".join(rand(rng, HEX, n) for n in (8, 4, 4, 4, 12))


def _basic_auth(rng: random.Random) -> str:
    user = rng.choice(["admin", "deploy", "ci-bot", "grafana", "elastic"])
    return base64.b64encode(f"{user}:{_url_password(rng)}".encode()).decode()


def _seed_phrase(rng: random.Random) -> str:
    """A wallet's recovery phrase as its wallet shows it: BIP-39, 12 or 24 words, mostly English."""
    from mnemonic import Mnemonic

    language = rng.choice(["english"] * 5 + ["spanish", "french", "japanese", "chinese_simplified", "korean"])
    return str(Mnemonic(language).to_mnemonic(bytes(rng.randrange(256) for _ in range(rng.choice((16, 16, 32))))))


def _card_number(rng: random.Random) -> str:
    """A card number with a network's prefix, its length and a valid check digit, grouped as printed."""
    prefix, length = rng.choice([("4", 16), ("51", 16), ("55", 16), ("2221", 16), ("37", 15), ("6011", 16),
                                 ("3530", 16), ("62", 16)])
    body = prefix + rand(rng, string.digits, length - len(prefix) - 1)
    total = sum(d - 9 if d > 9 else d for d in (int(c) * (2 if i % 2 == 0 else 1) for i, c in enumerate(body[::-1])))
    digits = body + str(-total % 10)
    sep = rng.choice(" -")
    groups = (4, 6, 5) if length == 15 else (4, 4, 4, 4)
    out, at = [], 0
    for size in groups:
        out.append(digits[at : at + size])
        at += size
    return sep.join(out)


def _k(
    rule: str, service: str, env: str, make: Callable[[random.Random], str], prefix: str = "", **kw: object
) -> SecretKind:
    return SecretKind(rule, service, env, make, prefix, **kw)  # type: ignore[arg-type]


KINDS: tuple[SecretKind, ...] = (
    # AI providers
    _k(
        "anthropic_api_key",
        "Anthropic",
        "ANTHROPIC_API_KEY",
        lambda r: "sk-ant-api03-" + rand(r, B64URL, 93) + "AA",
        "sk-ant-api03-",
    ),
    _k(
        "openai_project_key",
        "OpenAI",
        "OPENAI_API_KEY",
        lambda r: "sk-proj-" + rand(r, B64URL, 74) + "T3BlbkFJ" + rand(r, B64URL, 74),
        "sk-proj-",
    ),
    _k(
        "openai_api_key",
        "OpenAI",
        "OPENAI_API_KEY",
        lambda r: "sk-" + rand(r, ALNUM, 20) + "T3BlbkFJ" + rand(r, ALNUM, 20),
        "sk-",
    ),
    _k("openrouter_api_key", "OpenRouter", "OPENROUTER_API_KEY", lambda r: "sk-or-v1-" + rand(r, HEX, 64), "sk-or-v1-"),
    _k("deepseek_api_key", "DeepSeek", "DEEPSEEK_API_KEY", lambda r: "sk-" + rand_mixed(r, HEX, 32), "sk-"),
    _k("sk_api_key", "Moonshot", "MOONSHOT_API_KEY", lambda r: "sk-" + rand_mixed(r, ALNUM, 48), "sk-"),
    _k("groq_api_key", "Groq", "GROQ_API_KEY", lambda r: "gsk_" + rand(r, ALNUM, 52), "gsk_"),
    _k("xai_api_key", "xAI", "XAI_API_KEY", lambda r: "xai-" + rand(r, ALNUM, 80), "xai-"),
    _k("google_api_key", "Gemini", "GEMINI_API_KEY", lambda r: "AIza" + rand(r, B64URL, 35), "AIza"),
    _k(
        "google_oauth_client_secret",
        "Google OAuth",
        "GOOGLE_CLIENT_SECRET",
        lambda r: "GOCSPX-" + rand(r, B64URL, 28),
        "GOCSPX-",
    ),
    _k("google_oauth_token", "Google", "GOOGLE_ACCESS_TOKEN", lambda r: "ya29." + rand(r, B64URL, 120), "ya29."),
    _k("google_oauth_refresh_token", "Google", "GOOGLE_REFRESH_TOKEN", lambda r: "1//0" + rand(r, B64URL, 96), "1//0"),
    _k("huggingface_token", "Hugging Face", "HF_TOKEN", lambda r: "hf_" + rand(r, string.ascii_letters, 34), "hf_"),
    _k("replicate_api_token", "Replicate", "REPLICATE_API_TOKEN", lambda r: "r8_" + rand(r, ALNUM, 37), "r8_"),
    _k("perplexity_api_key", "Perplexity", "PERPLEXITY_API_KEY", lambda r: "pplx-" + rand(r, ALNUM, 48), "pplx-"),
    _k("tavily_api_key", "Tavily", "TAVILY_API_KEY", lambda r: "tvly-dev-" + rand(r, ALNUM, 32), "tvly-dev-"),
    _k(
        "langsmith_api_key",
        "LangSmith",
        "LANGSMITH_API_KEY",
        lambda r: "lsv2_pt_" + rand(r, HEX, 32) + "_" + rand(r, HEX, 10),
        "lsv2_pt_",
    ),
    _k("elevenlabs_api_key", "ElevenLabs", "ELEVENLABS_API_KEY", lambda r: "sk_" + rand(r, HEX, 48), "sk_"),
    _k("fireworks_api_key", "Fireworks", "FIREWORKS_API_KEY", lambda r: "fw_" + rand_mixed(r, ALNUM, 24), "fw_"),
    _k("firecrawl_api_key", "Firecrawl", "FIRECRAWL_API_KEY", lambda r: "fc-" + rand(r, HEX, 32), "fc-"),
    _k("zhipu_api_key", "智谱", "ZHIPUAI_API_KEY", lambda r: rand_mixed(r, HEX, 32) + "." + rand_mixed(r, ALNUM, 16)),
    _k(
        "baidu_qianfan_api_key",
        "千帆",
        "QIANFAN_API_KEY",
        lambda r: "bce-v3/ALTAK-" + rand(r, ALNUM, 21) + "/" + rand(r, HEX, 40),
        "bce-v3/ALTAK-",
        url_safe=False,
    ),
    # cloud
    _k("aws_access_key_id", "AWS", "AWS_ACCESS_KEY_ID", lambda r: "AKIA" + rand(r, UPPER_ALNUM, 16), "AKIA"),
    _k(
        "aws_secret_access_key",
        "AWS",
        "AWS_SECRET_ACCESS_KEY",
        lambda r: rand_mixed(r, B64, 39) + "Z",
        provider=False,
        context="aws",
        url_safe=False,
    ),
    _k(
        "azure_storage_account_key",
        "Azure Storage",
        "AZURE_STORAGE_KEY",
        lambda r: rand(r, B64, 86) + "==",
        wrap=lambda v: (
            f"DefaultEndpointsProtocol=https;AccountName=prodfiles;AccountKey={v};EndpointSuffix=core.windows.net"
        ),
        url_safe=False,
    ),
    _k(
        "azure_ad_client_secret",
        "Azure AD",
        "AZURE_CLIENT_SECRET",
        lambda r: rand(r, ALNUM, 3) + str(r.randrange(10)) + "Q~" + rand(r, ALNUM + "_-", 34),
        url_safe=False,
    ),
    _k(
        "azure_sas_token",
        "Azure Blob",
        "AZURE_SAS_URL",
        lambda r: rand(r, ALNUM, 40) + "%3D",
        wrap=lambda v: (
            f"https://prodfiles.blob.core.windows.net/backups?sv=2022-11-02&ss=b&srt=co&sp=rl&se=2026-12-31T00:00:00Z&sig={v}"
        ),
        url_safe=False,
    ),
    _k(
        "gcp_service_account_key",
        "GCP",
        "GOOGLE_APPLICATION_CREDENTIALS",
        lambda r: rand(r, HEX, 40),
        wrap=lambda v: f'{{"type": "service_account", "project_id": "demo-prod", "private_key_id": "{v}"}}',
        url_safe=False,
    ),
    _k(
        "alibaba_access_key_id",
        "阿里云",
        "ALIBABA_CLOUD_ACCESS_KEY_ID",
        lambda r: "LTAI5t" + rand(r, ALNUM, 18),
        "LTAI5t",
    ),
    _k(
        "alibaba_access_key_secret",
        "阿里云",
        "ALIBABA_CLOUD_ACCESS_KEY_SECRET",
        lambda r: rand_mixed(r, ALNUM, 30),
        provider=False,
        context="aliyun",
    ),
    _k("tencent_secret_id", "腾讯云", "TENCENTCLOUD_SECRET_ID", lambda r: "AKID" + rand(r, ALNUM, 32), "AKID"),
    _k(
        "tencent_secret_key",
        "腾讯云",
        "TENCENTCLOUD_SECRET_KEY",
        lambda r: rand_mixed(r, ALNUM, 32),
        provider=False,
        context="tencent",
    ),
    _k("digitalocean_token", "DigitalOcean", "DIGITALOCEAN_TOKEN", lambda r: "dop_v1_" + rand(r, HEX, 64), "dop_v1_"),
    _k(
        "cloudflare_api_token",
        "Cloudflare",
        "CLOUDFLARE_API_TOKEN",
        lambda r: rand_mixed(r, ALNUM, 38) + "_" + "Q",
        provider=False,
        context="cloudflare",
    ),
    _k(
        "cloudflare_global_api_key",
        "Cloudflare",
        "CLOUDFLARE_API_KEY",
        lambda r: rand_mixed(r, HEX, 37),
        provider=False,
        context="cloudflare",
    ),
    _k(
        "cloudflare_origin_ca_key",
        "Cloudflare",
        "CLOUDFLARE_ORIGIN_CA_KEY",
        lambda r: "v1.0-" + rand(r, HEX, 24) + "-" + rand(r, HEX, 146),
        "v1.0-",
    ),
    _k(
        "azure_openai_api_key",
        "Azure OpenAI",
        "AZURE_OPENAI_API_KEY",
        lambda r: rand_mixed(r, HEX, 32),
        provider=False,
        context="azure",
    ),
    _k(
        "mistral_api_key",
        "Mistral",
        "MISTRAL_API_KEY",
        lambda r: rand_mixed(r, ALNUM, 32),
        provider=False,
        context="mistral",
    ),
    _k(
        "twilio_auth_token",
        "Twilio",
        "TWILIO_AUTH_TOKEN",
        lambda r: rand_mixed(r, HEX, 32),
        provider=False,
        context="twilio",
    ),
    _k(
        "heroku_api_key_uuid",
        "Heroku",
        "HEROKU_API_KEY",
        lambda r: "-".join(rand(r, HEX, n) for n in (8, 4, 4, 4, 12)),
        provider=False,
        context="heroku",
    ),
    _k(
        "paypal_client_secret",
        "PayPal",
        "PAYPAL_CLIENT_SECRET",
        lambda r: "E" + rand_mixed(r, B64URL, 79),
        provider=False,
        context="paypal",
    ),
    _k(
        "cohere_api_key",
        "Cohere",
        "COHERE_API_KEY",
        lambda r: rand_mixed(r, ALNUM, 40),
        provider=False,
        context="cohere",
    ),
    _k("heroku_api_key", "Heroku", "HEROKU_API_KEY", lambda r: "HRKU-AA" + rand(r, B64URL, 58), "HRKU-"),
    _k("supabase_access_token", "Supabase", "SUPABASE_ACCESS_TOKEN", lambda r: "sbp_" + rand(r, HEX, 40), "sbp_"),
    _k(
        "supabase_secret_key",
        "Supabase",
        "SUPABASE_SECRET_KEY",
        lambda r: "sb_secret_" + rand(r, ALNUM, 31),
        "sb_secret_",
    ),
    _k("databricks_token", "Databricks", "DATABRICKS_TOKEN", lambda r: "dapi" + rand(r, HEX, 32), "dapi"),
    _k(
        "firebase_fcm_server_key",
        "Firebase",
        "FCM_SERVER_KEY",
        lambda r: "AAAA" + rand(r, B64URL, 7) + ":APA91b" + rand(r, B64URL, 134),
        "AAAA",
        url_safe=False,
    ),
    _k("hashicorp_vault_token", "Vault", "VAULT_TOKEN", lambda r: "hvs." + rand(r, B64URL, 90), "hvs."),
    _k(
        "terraform_cloud_token",
        "Terraform Cloud",
        "TFE_TOKEN",
        lambda r: rand(r, ALNUM, 14) + ".atlasv1." + rand(r, B64URL, 67),
        "",
    ),
    _k("doppler_token", "Doppler", "DOPPLER_TOKEN", lambda r: "dp.pt." + rand(r, ALNUM, 43), "dp.pt."),
    _k("pulumi_access_token", "Pulumi", "PULUMI_ACCESS_TOKEN", lambda r: "pul-" + rand(r, HEX, 40), "pul-"),
    _k("vercel_token", "Vercel", "VERCEL_TOKEN", lambda r: "vcp_" + rand_mixed(r, ALNUM, 56), "vcp_"),
    _k("netlify_token", "Netlify", "NETLIFY_AUTH_TOKEN", lambda r: "nfp_" + rand(r, ALNUM, 36), "nfp_"),
    # code hosting, packages
    _k("github_personal_access_token", "GitHub", "GITHUB_TOKEN", lambda r: "ghp_" + rand(r, ALNUM, 36), "ghp_"),
    _k("github_oauth_token", "GitHub", "GH_OAUTH_TOKEN", lambda r: "gho_" + rand(r, ALNUM, 36), "gho_"),
    _k("github_user_to_server_token", "GitHub", "GITHUB_TOKEN", lambda r: "ghu_" + rand(r, ALNUM, 36), "ghu_"),
    _k(
        "github_server_to_server_token", "GitHub Actions", "GITHUB_TOKEN", lambda r: "ghs_" + rand(r, ALNUM, 36), "ghs_"
    ),
    _k("github_refresh_token", "GitHub", "GITHUB_REFRESH_TOKEN", lambda r: "ghr_" + rand(r, ALNUM, 76), "ghr_"),
    _k(
        "github_fine_grained_pat",
        "GitHub",
        "GITHUB_PAT",
        lambda r: "github_pat_11" + rand(r, UPPER_ALNUM, 20) + "_" + rand(r, ALNUM, 59),
        "github_pat_",
    ),
    _k("gitlab_token", "GitLab", "GITLAB_TOKEN", lambda r: "glpat-" + rand(r, B64URL, 20), "glpat-"),
    _k("npm_token", "npm", "NPM_TOKEN", lambda r: "npm_" + rand(r, ALNUM, 36), "npm_"),
    _k(
        "pypi_token",
        "PyPI",
        "PYPI_TOKEN",
        lambda r: "pypi-AgEIcHlwaS5vcmc" + rand(r, B64URL, 140),
        "pypi-AgEIcHlwaS5vcmc",
    ),
    _k("dockerhub_token", "Docker Hub", "DOCKERHUB_TOKEN", lambda r: "dckr_pat_" + rand(r, B64URL, 27), "dckr_pat_"),
    _k(
        "atlassian_api_token",
        "Jira",
        "JIRA_API_TOKEN",
        lambda r: "ATATT3xFfGF0" + rand(r, B64URL, 170) + "=" + rand(r, HEX.upper(), 8),
        "ATATT3xFfGF0",
        url_safe=False,
    ),
    _k("linear_api_key", "Linear", "LINEAR_API_KEY", lambda r: "lin_api_" + rand(r, ALNUM, 40), "lin_api_"),
    _k("notion_token", "Notion", "NOTION_TOKEN", lambda r: "ntn_" + rand(r, ALNUM, 46), "ntn_"),
    _k("sentry_token", "Sentry", "SENTRY_AUTH_TOKEN", lambda r: "sntryu_" + rand(r, HEX, 64), "sntryu_"),
    _k(
        "postman_api_key",
        "Postman",
        "POSTMAN_API_KEY",
        lambda r: "PMAK-" + rand(r, HEX, 24) + "-" + rand(r, HEX, 34),
        "PMAK-",
    ),
    _k(
        "grafana_token",
        "Grafana",
        "GRAFANA_SERVICE_ACCOUNT_TOKEN",
        lambda r: "glsa_" + rand(r, ALNUM, 32) + "_" + rand(r, HEX, 8),
        "glsa_",
    ),
    _k("newrelic_api_key", "New Relic", "NEW_RELIC_API_KEY", lambda r: "NRAK-" + rand(r, UPPER_ALNUM, 27), "NRAK-"),
    _k("figma_token", "Figma", "FIGMA_TOKEN", lambda r: "figd_" + rand(r, B64URL, 40), "figd_"),
    _k(
        "airtable_token",
        "Airtable",
        "AIRTABLE_TOKEN",
        lambda r: "pat" + rand(r, ALNUM, 14) + "." + rand(r, HEX, 64),
        "pat",
    ),
    # messaging, email
    _k(
        "slack_token",
        "Slack",
        "SLACK_BOT_TOKEN",
        lambda r: f"xoxb-{r.randrange(10**11, 10**12)}-{r.randrange(10**12, 10**13)}-{rand(r, ALNUM, 24)}",
        "xoxb-",
    ),
    _k(
        "slack_app_token",
        "Slack",
        "SLACK_APP_TOKEN",
        lambda r: f"xapp-1-A{rand(r, UPPER_ALNUM, 10)}-{r.randrange(10**12, 10**13)}-{rand(r, HEX, 64)}",
        "xapp-",
    ),
    _k(
        "slack_webhook_url",
        "Slack",
        "SLACK_WEBHOOK_URL",
        lambda r: f"https://hooks.slack.com/services/T{rand(r, UPPER_ALNUM, 8)}/B{rand(r, UPPER_ALNUM, 10)}/"
        + rand(r, ALNUM, 24),
        url_safe=False,
        misses=("https://hooks.slack.com/services/T000/B000/XXXX", "https://hooks.slack.com/services/" + "x" * 40),
    ),
    _k(
        "telegram_bot_token",
        "Telegram",
        "TELEGRAM_BOT_TOKEN",
        lambda r: f"{r.randrange(10**8, 10**10)}:AA{rand_mixed(r, B64URL, 33)}",
        url_safe=False,
    ),
    _k(
        "discord_bot_token",
        "Discord",
        "DISCORD_BOT_TOKEN",
        lambda r: (
            r.choice("MNO") + rand_mixed(r, ALNUM, 23) + "." + rand(r, B64URL, 6) + "." + rand_mixed(r, B64URL, 38)
        ),
    ),
    _k(
        "discord_webhook_url",
        "Discord",
        "DISCORD_WEBHOOK_URL",
        lambda r: f"https://discord.com/api/webhooks/{r.randrange(10**17, 10**19)}/{rand(r, B64URL, 68)}",
        url_safe=False,
        misses=("https://discord.com/api/webhooks/123/abc", "https://discord.com/api/webhooks/{id}/{token}"),
    ),
    _k("twilio_api_key", "Twilio", "TWILIO_API_KEY", lambda r: "SK" + rand(r, HEX, 32), "SK"),
    _k(
        "sendgrid_api_key",
        "SendGrid",
        "SENDGRID_API_KEY",
        lambda r: "SG." + rand(r, B64URL, 22) + "." + rand(r, B64URL, 43),
        "SG.",
    ),
    _k("mailgun_api_key", "Mailgun", "MAILGUN_API_KEY", lambda r: "key-" + rand(r, HEX, 32), "key-"),
    _k(
        "mailchimp_api_key",
        "Mailchimp",
        "MAILCHIMP_API_KEY",
        lambda r: rand_mixed(r, HEX, 32) + f"-us{r.randrange(1, 21)}",
    ),
    _k(
        "resend_api_key",
        "Resend",
        "RESEND_API_KEY",
        lambda r: "re_" + rand(r, ALNUM, 8) + "_" + rand(r, ALNUM, 24),
        "re_",
    ),
    # payments
    _k("stripe_secret_key", "Stripe", "STRIPE_SECRET_KEY", lambda r: "sk_live_" + rand(r, ALNUM, 99), "sk_live_"),
    _k(
        "stripe_restricted_key",
        "Stripe",
        "STRIPE_RESTRICTED_KEY",
        lambda r: "rk_live_" + rand(r, ALNUM, 99),
        "rk_live_",
    ),
    _k("stripe_webhook_secret", "Stripe", "STRIPE_WEBHOOK_SECRET", lambda r: "whsec_" + rand(r, ALNUM, 32), "whsec_"),
    _k("shopify_token", "Shopify", "SHOPIFY_ACCESS_TOKEN", lambda r: "shpat_" + rand(r, HEX, 32), "shpat_"),
    _k("square_token", "Square", "SQUARE_ACCESS_TOKEN", lambda r: "EAAA" + rand_mixed(r, B64URL, 60), "EAAA"),
    _k("square_oauth_secret", "Square", "SQUARE_OAUTH_SECRET", lambda r: "sq0csp-" + rand(r, B64URL, 43), "sq0csp-"),
    _k(
        "braintree_token",
        "Braintree",
        "BRAINTREE_ACCESS_TOKEN",
        lambda r: f"production${rand(r, LOWER_ALNUM, 16)}${rand(r, HEX, 32)}",
        "production$",
        wrap=lambda v: "access_token$" + v,
        url_safe=False,
    ),
    # generic formats
    _k("jwt", "Supabase", "SUPABASE_SERVICE_ROLE_KEY", _jwt, "eyJ"),
    _k(
        "mapbox_secret_token",
        "Mapbox",
        "MAPBOX_SECRET_TOKEN",
        lambda r: "sk.eyJ1Ijoi" + rand(r, B64URL, 60) + "." + rand(r, B64URL, 22),
        "sk.eyJ",
    ),
    _k("dropbox_token", "Dropbox", "DROPBOX_ACCESS_TOKEN", lambda r: "sl.u." + rand(r, B64URL, 140), "sl.u."),
    _k(
        "age_secret_key",
        "age",
        "AGE_SECRET_KEY",
        lambda r: "AGE-SECRET-KEY-1" + rand(r, BECH32, 58),
        "AGE-SECRET-KEY-1",
    ),
    _k(
        "openssh_private_key",
        "SSH",
        "SSH_PRIVATE_KEY",
        lambda r: _pem(r, "OPENSSH PRIVATE KEY", 1600),
        "-----BEGIN OPENSSH PRIVATE KEY-----",
        multiline=True,
        url_safe=False,
    ),
    _k(
        "private_key_body",
        "PEM",
        "PRIVATE_KEY",
        lambda r: _key_body(r),
        "b3BlbnNzaC1rZXktdjE",
        multiline=True,
        url_safe=False,
    ),
    _k(
        "django_secret_key",
        "Django",
        "DJANGO_SECRET_KEY",
        lambda r: "django-insecure-" + rand(r, string.ascii_lowercase + string.digits + "!@#$%^&*(-_=+)", 50),
        "django-insecure-",
    ),
    _k(
        "pgp_private_key",
        "GPG",
        "GPG_PRIVATE_KEY",
        lambda r: _pem(r, "PGP PRIVATE KEY BLOCK", 2400),
        "-----BEGIN PGP PRIVATE KEY BLOCK-----",
        multiline=True,
        url_safe=False,
    ),
    _k(
        "private_key",
        "TLS",
        "TLS_PRIVATE_KEY",
        lambda r: _pem(r, r.choice(["RSA PRIVATE KEY", "PRIVATE KEY", "EC PRIVATE KEY"])),
        "-----BEGIN PRIVATE KEY-----",
        multiline=True,
        url_safe=False,
    ),
    _k(
        "putty_private_key",
        "PuTTY",
        "PUTTY_KEY",
        lambda r: (
            "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: deploy\nPublic-Lines: 2\n"
            + rand(r, B64, 64)
            + "\n"
            + rand(r, B64, 20)
            + "\nPrivate-Lines: 1\n"
            + rand(r, B64, 44)
            + "\nPrivate-MAC: "
            + rand(r, HEX, 64)
        ),
        "PuTTY-User-Key-File-3:",
        multiline=True,
        url_safe=False,
    ),
    # formats of the public scanners' rule sets (gitleaks, Nosey Parker), from the providers' formats
    _k(
        "kubernetes_secret_data",
        "Kubernetes",
        "K8S_SECRET",
        lambda r: base64.b64encode(_url_password(r).encode()).decode(),
        wrap=lambda v: "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\ndata:\n  password: " + v + "\n",
        multiline=True,
        url_safe=False,
    ),
    _k(
        "onepassword_secret_key",
        "1Password",
        "OP_SECRET_KEY",
        lambda r: "-".join(["A3", rand(r, UPPER_ALNUM, 6), rand(r, UPPER_ALNUM, 11)] + [rand(r, UPPER_ALNUM, 5)] * 3),
        "A3-",
    ),
    _k(
        "onepassword_service_account_token",
        "1Password",
        "OP_SERVICE_ACCOUNT_TOKEN",
        lambda r: "ops_eyJ" + rand(r, B64, 300),
        "ops_eyJ",
        url_safe=False,
    ),
    _k("adobe_client_secret", "Adobe", "ADOBE_CLIENT_SECRET", lambda r: "p8e-" + rand_mixed(r, ALNUM, 32), "p8e-"),
    _k("artifactory_api_key", "Artifactory", "ARTIFACTORY_API_KEY", lambda r: "AKCp" + rand(r, ALNUM, 69), "AKCp"),
    _k(
        "artifactory_reference_token",
        "Artifactory",
        "ARTIFACTORY_TOKEN",
        lambda r: "cmVmd" + rand_mixed(r, ALNUM, 59),
        "cmVmd",
    ),
    _k(
        "authress_access_key",
        "Authress",
        "AUTHRESS_KEY",
        lambda r: f"sc_{rand(r, ALNUM, 10)}.{rand(r, ALNUM, 5)}.acc_{rand(r, LOWER_ALNUM, 20)}.{rand(r, B64URL, 50)}",
        "sc_",
    ),
    _k("aws_bedrock_api_key", "Bedrock", "AWS_BEARER_TOKEN_BEDROCK", lambda r: "ABSK" + rand(r, B64, 150), "ABSK",
       url_safe=False),
    _k("clickhouse_api_secret", "ClickHouse", "CLICKHOUSE_SECRET", lambda r: "4b1d" + rand_mixed(r, ALNUM, 38), "4b1d"),
    _k("clojars_token", "Clojars", "CLOJARS_TOKEN", lambda r: "CLOJARS_" + rand(r, LOWER_ALNUM, 60), "CLOJARS_"),
    _k(
        "defined_networking_token",
        "Defined",
        "DN_API_KEY",
        lambda r: f"dnkey-{rand(r, ALNUM, 26)}-{rand(r, ALNUM, 52)}",
        "dnkey-",
    ),
    _k("duffel_token", "Duffel", "DUFFEL_TOKEN", lambda r: "duffel_test_" + rand(r, ALNUM, 43), "duffel_test_"),
    _k(
        "dynatrace_token",
        "Dynatrace",
        "DT_API_TOKEN",
        lambda r: f"dt0c01.{rand(r, UPPER_ALNUM, 24)}.{rand(r, UPPER_ALNUM, 64)}",
        "dt0c01.",
    ),
    _k("easypost_token", "EasyPost", "EASYPOST_API_KEY", lambda r: "EZAK" + rand(r, ALNUM, 54), "EZAK"),
    _k("facebook_access_token", "Facebook", "FB_ACCESS_TOKEN", lambda r: "EAAG" + rand(r, ALNUM, 150), "EAAG"),
    _k(
        "flutterwave_key",
        "Flutterwave",
        "FLW_SECRET_KEY",
        lambda r: "FLWSECK_TEST-" + rand(r, "abcdefgh0123456789", 32) + "-X",
        "FLWSECK_TEST-",
    ),
    _k("flyio_token", "Fly.io", "FLY_API_TOKEN", lambda r: "fo1_" + rand(r, B64URL, 43), "fo1_"),
    _k("frameio_token", "Frame.io", "FRAMEIO_TOKEN", lambda r: "fio-u-" + rand(r, B64URL, 64), "fio-u-"),
    _k(
        "freemius_secret_key",
        "Freemius",
        "FREEMIUS_SECRET_KEY",
        lambda r: "sk_" + rand_mixed(r, ALNUM + "!@#$%^&*", 29),
        "sk_",
        url_safe=False,
    ),
    _k(
        "gitlab_cookie",
        "GitLab",
        "GITLAB_SESSION",
        lambda r: "_gitlab_session=" + rand_mixed(r, LOWER_ALNUM, 32),
        "_gitlab_session=",
        url_safe=False,
    ),
    _k("gocardless_token", "GoCardless", "GOCARDLESS_TOKEN", lambda r: "live_" + rand_mixed(r, B64URL, 40), "live_"),
    _k("grafana_api_key", "Grafana", "GRAFANA_API_KEY", lambda r: "eyJrIjoi" + rand(r, ALNUM, 100), "eyJrIjoi"),
    _k(
        "harness_token",
        "Harness",
        "HARNESS_API_KEY",
        lambda r: f"pat.{rand(r, B64URL, 22)}.{rand(r, ALNUM, 24)}.{rand(r, ALNUM, 20)}",
        "pat.",
    ),
    _k("infracost_token", "Infracost", "INFRACOST_API_KEY", lambda r: "ico-" + rand(r, ALNUM, 32), "ico-"),
    _k("intra42_secret", "42", "FT_CLIENT_SECRET", lambda r: "s-s4t2ud-" + rand(r, HEX, 64), "s-s4t2ud-"),
    _k(
        "mapbox_token",
        "Mapbox",
        "MAPBOX_TOKEN",
        lambda r: "pk.eyJ1Ijoi" + rand(r, B64URL, 60) + "." + rand(r, B64URL, 22),
        "pk.eyJ",
    ),
    _k(
        "maxmind_license_key",
        "MaxMind",
        "MAXMIND_LICENSE_KEY",
        lambda r: f"{rand(r, ALNUM, 6)}_{rand(r, ALNUM, 29)}_mmk",
    ),
    _k("octopus_api_key", "Octopus", "OCTOPUS_API_KEY", lambda r: "API-" + rand(r, UPPER_ALNUM, 26), "API-"),
    _k("openshift_token", "OpenShift", "OPENSHIFT_TOKEN", lambda r: "sha256~" + rand(r, B64URL, 43), "sha256~",
       url_safe=False),
    _k("teamcity_token", "TeamCity", "TEAMCITY_TOKEN",
       lambda r: "eyJ0eXAiOiAiVENWMiJ9." + rand(r, B64URL, 36) + "." + rand(r, B64URL, 48), "eyJ0eXAiOiAiVENWMiJ9."),
    _k("planetscale_token", "PlanetScale", "PLANETSCALE_TOKEN", lambda r: "pscale_tkn_" + rand(r, ALNUM, 40),
       "pscale_tkn_"),
    _k(
        "plaid_access_token",
        "Plaid",
        "PLAID_ACCESS_TOKEN",
        lambda r: "access-sandbox-" + "-".join(rand(r, HEX, n) for n in (8, 4, 4, 4, 12)),
        "access-sandbox-",
    ),
    _k("prefect_token", "Prefect", "PREFECT_API_KEY", lambda r: "pnu_" + rand(r, ALNUM, 36), "pnu_"),
    _k("readme_token", "ReadMe", "README_API_KEY", lambda r: "rdme_" + rand(r, LOWER_ALNUM, 70), "rdme_"),
    _k("rubygems_token", "RubyGems", "GEM_HOST_API_KEY", lambda r: "rubygems_" + rand(r, HEX, 48), "rubygems_"),
    _k("scalingo_token", "Scalingo", "SCALINGO_API_TOKEN", lambda r: "tk-us-" + rand(r, B64URL, 48), "tk-us-"),
    _k(
        "sendinblue_api_key",
        "Brevo",
        "BREVO_API_KEY",
        lambda r: f"xkeysib-{rand(r, HEX, 64)}-{rand(r, ALNUM, 16)}",
        "xkeysib-",
    ),
    _k("settlemint_token", "SettleMint", "SETTLEMINT_TOKEN", lambda r: "sm_pat_" + rand(r, ALNUM, 16), "sm_pat_"),
    _k("shippo_token", "Shippo", "SHIPPO_API_TOKEN", lambda r: "shippo_live_" + rand(r, HEX, 40), "shippo_live_"),
    _k(
        "sidekiq_secret",
        "Sidekiq",
        "BUNDLE_ENTERPRISE__CONTRIBSYS__COM",
        lambda r: f"{rand(r, HEX, 8)}:{rand(r, HEX, 8)}",
        wrap=lambda v: "BUNDLE_ENTERPRISE__CONTRIBSYS__COM=" + v,
        url_safe=False,
    ),
    _k(
        "sourcegraph_token",
        "Sourcegraph",
        "SRC_ACCESS_TOKEN",
        lambda r: f"sgp_{rand(r, HEX, 16)}_{rand(r, HEX, 40)}",
        "sgp_",
    ),
    _k(
        "teams_webhook_url",
        "Microsoft Teams",
        "TEAMS_WEBHOOK_URL",
        lambda r: (
            "https://acme.webhook.office.com/webhookb2/" + _uuid(r) + "@" + _uuid(r) + "/IncomingWebhook/"
            + rand(r, HEX, 32) + "/" + _uuid(r)
        ),
        "https://acme.webhook.office.com/webhookb2/",
        url_safe=False,
    ),
    _k(
        "twitter_bearer_token",
        "Twitter",
        "TWITTER_BEARER_TOKEN",
        lambda r: "A" * 22 + rand_mixed(r, ALNUM, 90),
        "AAAAAAAAAAAAAAAAAAAAAA",
    ),
    _k("typeform_token", "Typeform", "TYPEFORM_TOKEN", lambda r: "tfp_" + rand(r, B64URL, 59), "tfp_"),
    _k("yandex_token", "Yandex", "YANDEX_API_KEY", lambda r: "AQVN" + rand_mixed(r, B64URL, 36), "AQVN"),
    _k(
        "jwt_base64",
        "JWT",
        "JWT_B64",
        lambda r: base64.b64encode(_jwt(r).encode()).decode().rstrip("="),
        "ZXlK",
        url_safe=False,
    ),
    _k("adafruit_io_key", "Adafruit IO", "ADAFRUIT_IO_KEY", lambda r: "aio_" + rand_mixed(r, ALNUM, 28), "aio_"),
    _k(
        "aws_session_token",
        "AWS",
        "AWS_SESSION_TOKEN",
        lambda r: "IQoJb3JpZ2luX2VjE" + rand(r, B64, 300),
        "IQoJb3JpZ2lu",
        url_safe=False,
    ),
    _k("amazon_mws_token", "Amazon MWS", "MWS_AUTH_TOKEN", lambda r: "amzn.mws." + _uuid(r), "amzn.mws."),
    _k("bitbucket_app_password", "Bitbucket", "BITBUCKET_APP_PASSWORD", lambda r: "ATBB" + rand_mixed(r, ALNUM, 32),
       "ATBB"),
    _k("crates_io_token", "crates.io", "CARGO_REGISTRY_TOKEN", lambda r: "cio" + rand_mixed(r, ALNUM, 32), "cio"),
    _k("dependency_track_key", "Dependency-Track", "DTRACK_API_KEY", lambda r: "odt_" + rand_mixed(r, ALNUM, 32),
       "odt_"),
    _k("jina_api_key", "Jina", "JINA_API_KEY", lambda r: "jina_" + rand(r, HEX, 32) + rand(r, B64URL, 28), "jina_"),
    _k(
        "mapbox_temporary_token",
        "Mapbox",
        "MAPBOX_TOKEN",
        lambda r: "tk.eyJ1Ijoi" + rand(r, B64URL, 60) + "." + rand(r, B64URL, 22),
        "tk.eyJ",
    ),
    _k("newrelic_pixie_key", "Pixie", "PIXIE_API_KEY", lambda r: "px-api-" + _uuid(r), "px-api-"),
    _k("nuget_api_key", "NuGet", "NUGET_API_KEY", lambda r: "oy2" + rand_mixed(r, LOWER_ALNUM, 43), "oy2"),
    _k(
        "salesforce_access_token",
        "Salesforce",
        "SF_ACCESS_TOKEN",
        lambda r: "00D" + rand(r, ALNUM, 12) + "!" + rand(r, ALNUM + "._", 96),
        "00D",
        url_safe=False,
    ),
    _k("segment_token", "Segment", "SEGMENT_TOKEN", lambda r: "sgp_" + rand_mixed(r, ALNUM, 64), "sgp_"),
    _k("sonarqube_token", "SonarQube", "SONAR_TOKEN", lambda r: "squ_" + rand(r, HEX, 40), "squ_"),
    _k(
        "stackhawk_key",
        "StackHawk",
        "HAWK_API_KEY",
        lambda r: f"hawk.{rand_mixed(r, ALNUM, 20)}.{rand_mixed(r, ALNUM, 20)}",
        "hawk.",
    ),
    _k("vault_recovery_token", "Vault", "VAULT_TOKEN", lambda r: "hvr." + rand(r, B64URL, 90), "hvr."),
    _k("tailscale_key", "Tailscale", "TAILSCALE_API_KEY",
       lambda r: f"tskey-{r.choice(['api', 'auth', 'client'])}-{rand_mixed(r, ALNUM, 12)}-{rand_mixed(r, ALNUM, 30)}",
       "tskey-"),
    _k("zoho_oauth_token", "Zoho", "ZOHO_TOKEN", lambda r: f"1000.{rand_mixed(r, HEX, 32)}.{rand_mixed(r, HEX, 32)}",
       "1000."),
    _k("pubnub_key", "PubNub", "PUBNUB_KEY",
       lambda r: f"{r.choice(['pub', 'sub'])}-c-" + "-".join(rand_mixed(r, HEX, n) for n in (8, 4, 4, 4, 12)),
       "pub-c-"),
    _k("pubnub_secret_key", "PubNub", "PUBNUB_SECRET_KEY", lambda r: "sec-c-" + rand_mixed(r, ALNUM, 48), "sec-c-"),
    _k(
        "pem_private_key_base64",
        "Kubernetes",
        "TLS_KEY",
        lambda r: base64.b64encode(_pem(r, "PRIVATE KEY", 600).encode()).decode(),
        "LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0t",
        url_safe=False,
    ),
    _k(
        "kubernetes_bootstrap_token",
        "Kubernetes",
        "KUBEADM_TOKEN",
        lambda r: rand_mixed(r, LOWER_ALNUM, 6) + "." + rand_mixed(r, LOWER_ALNUM, 16),
        provider=False,
        context="kubeadm",
    ),
    _k("lob_api_key", "Lob", "LOB_API_KEY", lambda r: "live_" + rand_mixed(r, HEX, 35), "live_"),
    _k("okta_api_token", "Okta", "OKTA_API_TOKEN", lambda r: "00" + rand_mixed(r, B64URL, 40), provider=False,
       context="okta"),
    _k("vault_legacy_token", "Vault", "VAULT_TOKEN", lambda r: "s." + rand_mixed(r, ALNUM, 24), provider=False,
       context="vault"),
    _k("newrelic_license_key", "New Relic", "NEW_RELIC_LICENSE_KEY",
       lambda r: rand(r, LOWER_ALNUM, 6) + rand_mixed(r, HEX, 30) + "NRAL"),
    _k("newrelic_mobile_token", "New Relic", "NEW_RELIC_MOBILE_TOKEN",
       lambda r: rand(r, LOWER_ALNUM, 6) + rand_mixed(r, HEX, 36) + "-NRMA"),
    _k("tines_webhook_url", "Tines", "TINES_WEBHOOK_URL",
       lambda r: f"https://{rand(r, LOWER_ALNUM, 8)}.tines.com/webhook/{rand(r, LOWER_ALNUM, 32)}/"
       + rand(r, LOWER_ALNUM, 32), url_safe=False),
    _k("zapier_webhook_url", "Zapier", "ZAPIER_WEBHOOK_URL",
       lambda r: f"https://hooks.zapier.com/hooks/catch/{r.randrange(10**6, 10**8)}/{rand(r, LOWER_ALNUM, 6)}/",
       url_safe=False),
    _k("azure_devops_pat", "Azure DevOps", "AZURE_DEVOPS_PAT",
       lambda r: rand_mixed(r, ALNUM, 52) + "JQQJ99" + rand_mixed(r, ALNUM, 18) + "AZDO" + rand(r, ALNUM, 4)),
    _k("sonarqube_login_token", "SonarQube", "SONAR_LOGIN", lambda r: rand_mixed(r, HEX, 40), provider=False,
       context="sonar.login"),
    _k("codeclimate_reporter_id", "CodeClimate", "CC_TEST_REPORTER_ID", lambda r: rand_mixed(r, HEX, 64),
       provider=False, context="CC_TEST_REPORTER_ID"),
    _k("jenkins_token", "Jenkins", "JENKINS_API_TOKEN", lambda r: "11" + rand_mixed(r, HEX, 32), provider=False,
       context="Jenkins-Crumb"),
    _k("asana_pat", "Asana", "ASANA_ACCESS_TOKEN",
       lambda r: f"2/{rand(r, '123456789', 16)}/{rand(r, '123456789', 16)}:{rand_mixed(r, HEX, 32)}", "2/",
       url_safe=False),
    _k("twitch_oauth_token", "Twitch", "TWITCH_OAUTH_TOKEN", lambda r: "oauth:" + rand_mixed(r, LOWER_ALNUM, 30),
       "oauth:", url_safe=False),
    _k("buildkite_token", "Buildkite", "BUILDKITE_API_TOKEN", lambda r: "bkua_" + rand_mixed(r, HEX, 40), "bkua_"),
    _k("langfuse_secret_key", "Langfuse", "LANGFUSE_SECRET_KEY", lambda r: "sk-lf-" + _uuid(r), "sk-lf-"),
    # secrets a person holds: a wallet's seed phrase (its checksum holds), a card number as printed
    _k("seed_phrase", "MetaMask", "WALLET_MNEMONIC", _seed_phrase, url_safe=False),
    _k("payment_card", "Visa", "CARD_NUMBER", _card_number, url_safe=False),
    # generic chat forms: no known format, found through a name or a cue
    _k("token_cue", "TokenMall", "TOKENMALL_API_KEY", _opaque, provider=False),
    _k("password_cue", "GitLab", "DB_PASSWORD", _password, provider=False, password=True, url_safe=False),
    _k("url_credentials", "PostgreSQL", "DATABASE_URL", _url_password, provider=False, password=True),
    _k("authorization_header", "internal API", "API_TOKEN", lambda r: rand_mixed(r, B64URL, 40), provider=False),
    _k("basic_auth", "Elastic", "ELASTIC_AUTH", _basic_auth, provider=False, url_safe=False),
)

KINDS_BY_RULE: dict[str, SecretKind] = {k.rule: k for k in KINDS}
GENERIC_KINDS = ("token_cue", "password_cue", "url_credentials", "authorization_header", "basic_auth")


# ---------------------------------------------------------------------------------------------
# Templates. `{v}` is the secret (after `wrap`), `{svc}` the service, `{env}` its variable name.
# Flags say what a template gives a detector: a cue word next to the value, or the service named
# before it (needed by context rules such as AWS secret keys).


@dataclass(frozen=True)
class Template:
    category: str
    text: str
    cue: bool  # a secret-ish word or variable name sits right before the value
    svc_before: bool  # the service or variable name occurs before the value (within ~100 chars)
    multiline_ok: bool = True
    url: bool = False  # the value is a URL's password


TEMPLATES: tuple[Template, ...] = (
    # English prose
    Template("en", "here is the {svc} key: {v}", True, True),
    Template("en", "Here's my {svc} API key {v} — please store it somewhere safe.", False, True, False),
    Template("en", "use this {svc} token for the deploy: {v}", True, True),
    Template("en", "Can you set up the {svc} integration? The key is {v}", True, True),
    Template("en", "I rotated the {svc} credentials, the new secret is {v}. The old one is revoked.", True, True),
    Template("en", "ok so {v} is what {svc} gave me, don't share it", False, False, False),
    Template("en", "Quick one: the bot needs {v} to talk to {svc}.", False, False, False),
    Template("en", "{svc} access token:\n{v}\nthanks!", True, True),
    # Chinese prose
    Template("zh", "这是{svc}的密钥：{v}，请帮我保存一下", True, True),
    Template("zh", "{svc} 的 API Key 是 {v} 别弄丢了", True, True),
    Template("zh", "key 是 {v}", True, False),
    Template("zh", "帮我把这个{svc}令牌记下来：{v}", True, True),
    Template("zh", "新的{svc} token：{v}（旧的已经作废）", True, True),
    Template("zh", "我刚申请了{svc}的账号，{v}，你帮我配置一下", False, True, False),
    Template("zh", "{svc}的密钥在这里\n{v}\n用完记得删掉", False, True),
    # code blocks
    Template(
        "code",
        '```python\nimport os\nclient = Client(api_key="{v}")\nprint(client.models.list())\n```',
        True,
        False,
        False,
    ),
    Template("code", "```bash\nexport {env}={v}\npython main.py\n```", True, True, False),
    Template(
        "code",
        "```js\nconst apiToken = '{v}';\nawait fetch(url, { headers: { Authorization: `Bearer ${apiToken}` } });\n```",
        True,
        False,
        False,
    ),
    Template("code", "```yaml\n{svc_id}:\n  api_key: {v}\n  timeout: 30\n```", True, True, False),
    Template("code", "```\n{v}\n```\nthat's the {svc} one", False, False),
    Template("code", 'PowerShell: `$env:{env}="{v}"`', True, True, False),
    # JSON
    Template("json", '{"provider": "{svc}", "apiKey": "{v}", "model": "default"}', True, True, False),
    Template("json", '```json\n{\n  "{env_lower}": "{v}",\n  "enabled": true\n}\n```', True, True, False),
    Template(
        "json", 'config dump: {"auth": {"mode": "token", "token": "{v}"}, "service": "{svc}"}', True, False, False
    ),
    # .env dumps
    Template(
        "env",
        "here's my .env:\n```\nNODE_ENV=production\nPORT=3000\n{env}={v}\nLOG_LEVEL=debug\n```",
        True,
        True,
        False,
    ),
    Template("env", '{env}="{v}"\nREGION=us-east-1', True, True, False),
    Template("env", "docker run -e {env}={v} -p 8080:8080 myapp:latest", True, True, False),
    # backticks and commands
    Template("backtick", "my {svc} key is `{v}`", True, True, False),
    Template("backtick", "运行前先设置 `{env}={v}`", True, True, False),
    Template(
        "curl", 'curl https://api.example.com/v1/chat -H "Authorization: Bearer {v}" -d @req.json', True, False, False
    ),
    Template("curl", "{svc} CLI: mytool login --token {v}", True, True, False),
    Template("curl", "GET https://api.example.com/v1/data?api_key={v}&format=json ({svc})", True, False, False),
    # other shapes
    Template("zh", "（{svc} key：{v}）", True, True, False),
    Template("en", "| service | value |\n|---|---|\n| {svc} | {v} |", False, True, False),
    Template(
        "json", '{"tool": "write", "content": "{\\"apiKey\\": \\"{v}\\", \\"svc\\": \\"{svc}\\"}"}', True, False, False
    ),
)

PASSWORD_TEMPLATES: tuple[Template, ...] = (
    Template("en", "my {svc} password is {v}", True, True),
    Template("en", "the password for the {svc} admin panel is {v} (please change it later)", True, True),
    Template("en", "Login: admin / Password: {v}", True, False),
    Template("en", "pwd: {v}", True, False),
    Template("en", "The wifi password is `{v}`.", True, False),
    Template("zh", "{svc}的密码是{v}，你帮我记一下", True, True),
    Template("zh", "密码：{v}", True, False),
    Template("zh", "服务器root密码为 {v} ，别外传", True, False),
    Template("zh", "wifi密码是{v}", True, False),
    Template("zh", "口令是 {v}", True, False),
    Template("env", "```\nDB_HOST=10.0.0.5\nDB_USER=app\nDB_PASSWORD={v}\n```", True, True),
    Template("code", "```bash\nexport MYSQL_ROOT_PASSWORD='{v}'\n```", True, True),
    Template("json", '{"username": "ops", "password": "{v}"}', True, False),
    Template("curl", "mysql -h db.internal -u root --password={v} shop", True, False),
)

URL_TEMPLATES: tuple[Template, ...] = (
    Template("url", "connect with postgres://admin:{v}@db.internal:5432/app", True, False, url=True),
    Template("url", "DATABASE_URL=mysql://root:{v}@10.0.0.5:3306/shop", True, True, url=True),
    Template("url", "redis 连接串：redis://default:{v}@cache.example.cn:6379/0", True, False, url=True),
    Template("url", "git clone https://deploy:{v}@git.example.com/team/repo.git", True, False, url=True),
    Template(
        "url", "```\nmongodb+srv://svc:{v}@cluster0.ab1cd.mongodb.net/prod?retryWrites=true\n```", True, False, url=True
    ),
    Template("url", "curl -u ops:{v} https://grafana.example.com/api/health", True, False, url=True),
)

HEADER_TEMPLATES: tuple[Template, ...] = (
    Template("curl", "curl -H 'Authorization: Bearer {v}' https://internal.example.com/api", True, False),
    Template(
        "curl", "GET /v1/items HTTP/1.1\nHost: api.example.com\nAuthorization: Bearer {v}\nAccept: */*", True, False
    ),
    Template("json", '{"headers": {"Authorization": "Bearer {v}"}}', True, False),
    Template("code", '```python\nheaders = {"Authorization": "Bearer {v}"}\n```', True, False),
)

BASIC_TEMPLATES: tuple[Template, ...] = (
    Template("curl", 'curl -H "Authorization: Basic {v}" https://es.example.com:9200/_cat/indices', True, False),
    Template("en", "the proxy wants Authorization: Basic {v}", True, False),
)


@dataclass(frozen=True)
class Planted:
    rule: str  # the kind's expected rule (generic kinds: the form)
    value: str
    start: int
    end: int


@dataclass(frozen=True)
class CorpusMessage:
    text: str
    planted: tuple[Planted, ...]
    category: str


def _fill(template: str, kind: SecretKind, wrapped: str) -> str:
    svc_id = "".join(c for c in kind.service.lower() if c.isalnum()) or "service"
    out = template
    for key, val in (
        ("{svc_id}", svc_id),
        ("{svc}", kind.service),
        ("{env_lower}", kind.env_name.lower()),
        ("{env}", kind.env_name),
    ):
        out = out.replace(key, val)
    return out.replace("{v}", wrapped)


def _templates_for(kind: SecretKind) -> tuple[Template, ...]:
    if kind.rule == "password_cue":
        return PASSWORD_TEMPLATES
    if kind.rule == "url_credentials":
        return URL_TEMPLATES
    if kind.rule == "authorization_header":
        return HEADER_TEMPLATES
    if kind.rule == "basic_auth":
        return BASIC_TEMPLATES
    usable = []
    for t in TEMPLATES:
        if kind.multiline and not t.multiline_ok:
            continue
        if not kind.provider and not t.cue:
            continue  # an unknown format is only findable through its name or a cue
        if kind.context and not t.svc_before:
            continue
        if kind.wrap is not None and t.category in ("env", "backtick") and "{env}" in t.text:
            continue  # a connection string is not one shell word
        usable.append(t)
    return tuple(usable)


def make_message(rng: random.Random, kind: SecretKind, template: Template) -> CorpusMessage:
    value = kind.make(rng)
    wrapped = kind.wrap(value) if kind.wrap else value
    if kind.rule == "aws_secret_access_key":
        # AWS keys come in pairs; the id names the context and is a planted secret too
        key_id = "AKIA" + rand(rng, UPPER_ALNUM, 16)
        text = f"AWS access key id {key_id}\n" + _fill(template.text, kind, wrapped)
        planted = [Planted("aws_access_key_id", key_id, text.index(key_id), text.index(key_id) + len(key_id))]
    else:
        text = _fill(template.text, kind, wrapped)
        planted = []
    offset = text.index(wrapped) + (wrapped.index(value) if kind.wrap else 0)
    planted.append(Planted(kind.rule, value, offset, offset + len(value)))
    return CorpusMessage(text, tuple(planted), template.category)


def _env_dump(rng: random.Random, kinds: list[SecretKind]) -> CorpusMessage:
    lines = ["# production", "NODE_ENV=production", "PORT=8080"]
    planted_values: list[tuple[SecretKind, str]] = []
    for kind in kinds:
        value = kind.make(rng)
        lines.append(f"{kind.env_name}={value}")
        planted_values.append((kind, value))
        if rng.random() < 0.4:
            lines.append(rng.choice(["LOG_LEVEL=info", "REGION=cn-hangzhou", "TIMEOUT_MS=3000", "# keys below"]))
    body = "\n".join(lines)
    text = rng.choice(["my .env file:\n```\n{}\n```", "这是我的 .env 配置：\n{}", "{}"]).format(body)
    planted = []
    for kind, value in planted_values:
        pos = text.index(f"{kind.env_name}={value}") + len(kind.env_name) + 1
        planted.append(Planted(kind.rule, value, pos, pos + len(value)))
    return CorpusMessage(text, tuple(planted), "env")


def generate_corpus(n: int = 1200, seed: int = 20260317) -> list[CorpusMessage]:
    """`n` messages; every kind appears in several template categories. Deterministic per seed."""
    rng = random.Random(seed)
    messages: list[CorpusMessage] = []
    single_line = [k for k in KINDS if not k.multiline and k.rule not in GENERIC_KINDS and not k.wrap and k.url_safe]
    i = k = 0
    while len(messages) < n:
        if i % 15 == 14:
            # a pasted .env dump with several keys at once
            messages.append(_env_dump(rng, rng.sample(single_line, rng.randrange(2, 5))))
        else:
            kind_index = k % len(KINDS)
            k += 1
            kind = KINDS[kind_index]
            templates = _templates_for(kind)
            # offset by the kind so that every template is used, not only the first few
            template = templates[(k // len(KINDS) + kind_index) % len(templates)]
            messages.append(make_message(rng, kind, template))
        i += 1
    return messages


def near_misses(kind: SecretKind, rng: random.Random) -> list[str]:
    """Strings shaped like `kind` that are not secrets: too short, or placeholders."""
    value = kind.make(rng)
    prefix = kind.prefix
    misses: list[str] = list(kind.misses)
    if kind.multiline:
        misses.append(prefix + "\n...\n" + prefix.replace("BEGIN", "END"))
        misses.append(prefix)
        return misses
    if kind.context:
        return [value]  # the right shape, but no context word nearby
    if prefix:
        misses.append(prefix + value[len(prefix) : len(prefix) + 6])
        misses.append(prefix + "x" * (len(value) - len(prefix)))
    else:
        misses.append(value[: len(value) // 3])
        misses.append(value[0] + "x" * (len(value) - 1))
    return misses
