"""The rule table: provider formats, formats named by nearby words, and the generic chat forms."""

from __future__ import annotations

import base64
import binascii
import json
import re

from veritas_watch.transforms.redact.base import (
    _CUE_SEP,
    _DATE_RE,
    _PATH_RE,
    _REFERENCE_RE,
    _TARGET,
    _UUID_RE,
    Extractor,
    Rule,
    RuleKind,
    Strength,
    _ascending_run,
    _case_switches,
    _char_classes,
    _has_letter_and_digit,
    _Hit,
    _is_placeholder,
    _is_wordish,
    _plausible,
    _random_printable,
    shannon_entropy,
)
from veritas_watch.transforms.redact.extract import (
    _extract_assignment,
    _extract_auth_header,
    _extract_basic_auth,
    _extract_cli_flag,
    _extract_context,
    _extract_curl_user,
    _extract_password_cue,
    _extract_provider,
    _extract_token_cue,
    _extract_url_credentials,
    _trim,
)
from veritas_watch.transforms.redact.names import _known_service_near, _service_before, is_secret_name
from veritas_watch.transforms.redact.personal import PERSONAL_RULES

# ---------------------------------------------------------------------------------------------
# Rule table

_L = r"(?<![A-Za-z0-9_\-])"  # left boundary: ASCII only, so CJK text may touch the key
_R = r"(?![A-Za-z0-9_\-])"
_B64L = r"(?<![A-Za-z0-9+/_\-])"  # `=` may precede: `KEY=base64...`
_B64R = r"(?![A-Za-z0-9+/_\-])"


def _p(
    name: str,
    service: str,
    key_name: str,
    regex: str,
    keywords: tuple[str, ...],
    *,
    entropy: float = 2.5,
    shared: bool = False,
    flags: int = 0,
) -> Rule:
    return Rule(
        name=name,
        service=service,
        key_name=key_name,
        kind="provider",
        pattern=re.compile(regex, re.ASCII | flags),
        keywords=keywords,
        extract=_extract_provider,
        min_entropy=entropy,
        shared_format=shared,
    )


def _c(
    name: str,
    service: str,
    key_name: str,
    regex: str,
    context_words: tuple[str, ...],
    *,
    window: int = 100,
    entropy: float = 3.0,
) -> Rule:
    return Rule(
        name=name,
        service=service,
        key_name=key_name,
        kind="context",
        pattern=re.compile(regex, re.ASCII),
        keywords=context_words,
        extract=_extract_context,
        min_entropy=entropy,
        context_words=context_words,
        context_window=window,
    )


def _g(
    name: str,
    regex: str,
    keywords: tuple[str, ...],
    extract: Extractor,
    kind: RuleKind = "generic",
    key_name: str | None = None,
) -> Rule:
    return Rule(
        name=name,
        service="Unknown",
        key_name=key_name or name,
        kind=kind,
        pattern=re.compile(regex),
        keywords=keywords,
        extract=extract,
    )


def _pem_block(label: str, limit: int = 20000) -> str:
    """A PEM block: BEGIN, a body that crosses no other `-----`, END; or, pasted without its END,
    BEGIN and base64 lines (literal `\\n` too, as in JSON). The tempered body keeps the scan linear
    when a text repeats BEGIN lines without bodies."""
    body = r"(?:(?!-----)[\s\S]){20," + str(limit) + "}?"
    truncated = r"\s*(?:\\n)?[A-Za-z0-9+/=]{40,}[A-Za-z0-9+/=\s\\]{0," + str(limit) + "}"
    return f"-----BEGIN {label}-----(?:{body}-----END {label}-----|{truncated})"


# a JWT segment: base64url, or base64 (`+/`) as some issuers write it; a `\` that escapes no quote or
# line break is part of it as pasted from a string (`\/`)
_JWT_SEG = r"(?:[A-Za-z0-9_\-/+]|\\(?![nrt\"]))"

_PROVIDER_RULES: tuple[Rule, ...] = (
    # --- AI model providers
    _p(
        "anthropic_api_key",
        "Anthropic",
        "ANTHROPIC_API_KEY",
        _L + r"sk-ant-(?:api|admin|oat|ort|sid)\d{2}-[A-Za-z0-9_\-]{32,}" + _R,
        ("sk-ant-",),
    ),
    _p(
        "openai_project_key",
        "OpenAI",
        "OPENAI_API_KEY",
        _L + r"sk-(?:proj|svcacct|admin|None)-[A-Za-z0-9_\-]{40,}" + _R,
        ("sk-proj-", "sk-svcacct-", "sk-admin-", "sk-none-"),
    ),
    _p(
        "openai_api_key",
        "OpenAI",
        "OPENAI_API_KEY",
        _L + r"sk-[A-Za-z0-9]{20}T3BlbkFJ[A-Za-z0-9]{20}" + _R,
        ("t3blbkfj",),
    ),
    _p("openrouter_api_key", "OpenRouter", "OPENROUTER_API_KEY", _L + r"sk-or-v1-[a-f0-9]{64}" + _R, ("sk-or-",)),
    _p("deepseek_api_key", "DeepSeek", "DEEPSEEK_API_KEY", _L + r"sk-[a-f0-9]{32}" + _R, ("sk-",), shared=True),
    _p(
        "sk_api_key",
        "OpenAI-compatible",
        "API_KEY",
        _L + r"sk-(?=[A-Za-z0-9]*[0-9])(?=[A-Za-z0-9]*[A-Za-z])[A-Za-z0-9]{32,100}" + _R,
        ("sk-",),
        entropy=3.2,
        shared=True,
    ),
    _p("groq_api_key", "Groq", "GROQ_API_KEY", _L + r"gsk_[A-Za-z0-9]{52}" + _R, ("gsk_",)),
    _p("xai_api_key", "xAI", "XAI_API_KEY", _L + r"xai-[A-Za-z0-9]{80}" + _R, ("xai-",)),
    _p("google_api_key", "Google", "GOOGLE_API_KEY", _L + r"AIza[0-9A-Za-z_\-]{35}" + _R, ("aiza",), shared=True),
    _p(
        "google_oauth_client_secret",
        "Google",
        "GOOGLE_CLIENT_SECRET",
        _L + r"GOCSPX-[A-Za-z0-9_\-]{28}" + _R,
        ("gocspx-",),
    ),
    _p("google_oauth_token", "Google", "GOOGLE_ACCESS_TOKEN", _L + r"ya29\.[A-Za-z0-9_\-]{30,}" + _R, ("ya29.",)),
    _p("google_oauth_refresh_token", "Google", "GOOGLE_REFRESH_TOKEN", _L + r"1//0[A-Za-z0-9_\-]{40,}" + _R, ("1//0",)),
    _p(
        "huggingface_token",
        "Hugging Face",
        "HF_TOKEN",
        _L + r"(?:hf_|api_org_)[A-Za-z0-9]{34,40}" + _R,
        ("hf_", "api_org_"),
    ),
    _p("replicate_api_token", "Replicate", "REPLICATE_API_TOKEN", _L + r"r8_[A-Za-z0-9]{37}" + _R, ("r8_",)),
    _p("perplexity_api_key", "Perplexity", "PERPLEXITY_API_KEY", _L + r"pplx-[A-Za-z0-9]{48}" + _R, ("pplx-",)),
    _p("tavily_api_key", "Tavily", "TAVILY_API_KEY", _L + r"tvly-(?:dev-|prod-)?[A-Za-z0-9]{32}" + _R, ("tvly-",)),
    _p(
        "langsmith_api_key",
        "LangSmith",
        "LANGSMITH_API_KEY",
        _L + r"lsv2_(?:pt|sk)_[a-f0-9]{32}_[a-f0-9]{10}" + _R,
        ("lsv2_",),
    ),
    _p("elevenlabs_api_key", "ElevenLabs", "ELEVENLABS_API_KEY", _L + r"sk_[a-f0-9]{48}" + _R, ("sk_",)),
    _p(
        "fireworks_api_key", "Fireworks AI", "FIREWORKS_API_KEY", _L + r"fw_[A-Za-z0-9]{24}" + _R, ("fw_",), entropy=3.0
    ),
    _p("firecrawl_api_key", "Firecrawl", "FIRECRAWL_API_KEY", _L + r"fc-[a-f0-9]{32}" + _R, ("fc-",)),
    _p("zhipu_api_key", "Zhipu", "ZHIPUAI_API_KEY", _L + r"[a-f0-9]{32}\.[A-Za-z0-9]{16}" + _R, ()),
    _p(
        "baidu_qianfan_api_key",
        "Baidu Qianfan",
        "QIANFAN_API_KEY",
        _L + r"bce-v3/ALTAK-[A-Za-z0-9]{21}/[a-f0-9]{40}" + _R,
        ("bce-v3/",),
    ),
    # --- cloud
    _p(
        "aws_access_key_id",
        "AWS",
        "AWS_ACCESS_KEY_ID",
        r"(?<![A-Z0-9])(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}(?![A-Z0-9])",
        ("akia", "asia", "abia", "acca", "a3t"),
    ),
    _p(
        "azure_storage_account_key",
        "Azure",
        "AZURE_STORAGE_KEY",
        r"(?i:AccountKey)=(?P<secret>[A-Za-z0-9+/]{86}==)",
        ("accountkey=",),
    ),
    _p(
        "azure_ad_client_secret",
        "Azure",
        "AZURE_CLIENT_SECRET",
        r"(?<![A-Za-z0-9_~.\-])[A-Za-z0-9_~.]{3}\dQ~[A-Za-z0-9_~.\-]{31,34}(?![A-Za-z0-9_~.\-])",
        ("q~",),
    ),
    _p(
        "azure_sas_token",
        "Azure",
        "AZURE_SAS_TOKEN",
        r"[?&]sv=\d{4}-\d{2}-\d{2}[^\s\"'<>]{0,300}?[?&]sig=(?P<secret>[A-Za-z0-9%+/=]{30,})",
        ("sig=",),
    ),
    _p(
        "gcp_service_account_key",
        "Google Cloud",
        "GOOGLE_APPLICATION_CREDENTIALS",
        r"\"private_key_id\"\s*:\s*\"(?P<secret>[a-f0-9]{40})\"",
        ("private_key_id",),
    ),
    _p(
        "alibaba_access_key_id",
        "Alibaba Cloud",
        "ALIBABA_CLOUD_ACCESS_KEY_ID",
        _L + r"LTAI[A-Za-z0-9]{12,20}" + _R,
        ("ltai",),
    ),
    _p("tencent_secret_id", "Tencent Cloud", "TENCENTCLOUD_SECRET_ID", _L + r"AKID[A-Za-z0-9]{32}" + _R, ("akid",)),
    _p(
        "digitalocean_token",
        "DigitalOcean",
        "DIGITALOCEAN_TOKEN",
        _L + r"do[opr]_v1_[a-f0-9]{64}" + _R,
        ("dop_v1_", "doo_v1_", "dor_v1_"),
    ),
    _p(
        "cloudflare_origin_ca_key",
        "Cloudflare",
        "CLOUDFLARE_ORIGIN_CA_KEY",
        _L + r"v1\.0-[a-f0-9]{24}-[a-f0-9]{146}" + _R,
        ("v1.0-",),
    ),
    _p("heroku_api_key", "Heroku", "HEROKU_API_KEY", _L + r"HRKU-[A-Za-z0-9_\-]{60}" + _R, ("hrku-",)),
    _p("supabase_access_token", "Supabase", "SUPABASE_ACCESS_TOKEN", _L + r"sbp_[a-f0-9]{40}" + _R, ("sbp_",)),
    _p(
        "supabase_secret_key",
        "Supabase",
        "SUPABASE_SECRET_KEY",
        _L + r"sb_secret_[A-Za-z0-9_\-]{20,}" + _R,
        ("sb_secret_",),
    ),
    _p("databricks_token", "Databricks", "DATABRICKS_TOKEN", _L + r"dapi[a-f0-9]{32}(?:-\d)?" + _R, ("dapi",)),
    _p(
        "firebase_fcm_server_key",
        "Firebase",
        "FCM_SERVER_KEY",
        _L + r"AAAA[A-Za-z0-9_\-]{7}:APA91b[A-Za-z0-9_\-]{100,}" + _R,
        ("apa91b",),
    ),
    _p(
        "hashicorp_vault_token",
        "HashiCorp Vault",
        "VAULT_TOKEN",
        _L + r"hv[sb]\.[A-Za-z0-9_\-]{24,}" + _R,
        ("hvs.", "hvb."),
    ),
    _p(
        "terraform_cloud_token",
        "Terraform Cloud",
        "TFE_TOKEN",
        _L + r"[A-Za-z0-9]{14}\.atlasv1\.[A-Za-z0-9_=\-]{60,70}" + _R,
        ("atlasv1",),
    ),
    _p(
        "doppler_token",
        "Doppler",
        "DOPPLER_TOKEN",
        # service tokens may name their environment: `dp.st.<config>.<40-44>`
        _L + r"dp\.(?:pt|st|sa|ct|scim|audit)\.(?:[a-z0-9_\-]{2,35}\.)?[A-Za-z0-9]{40,44}" + _R,
        ("dp.",),
    ),
    _p("pulumi_access_token", "Pulumi", "PULUMI_ACCESS_TOKEN", _L + r"pul-[a-f0-9]{40}" + _R, ("pul-",)),
    _p(
        "vercel_token",
        "Vercel",
        "VERCEL_TOKEN",
        _L + r"vc[pkiar]_[A-Za-z0-9]{24,60}" + _R,
        ("vcp_", "vck_", "vci_", "vca_", "vcr_"),
        entropy=3.0,
    ),
    _p("netlify_token", "Netlify", "NETLIFY_AUTH_TOKEN", _L + r"nfp_[A-Za-z0-9]{36}" + _R, ("nfp_",)),
    # --- code hosting, packages, CI
    _p("github_personal_access_token", "GitHub", "GITHUB_TOKEN", _L + r"ghp_[A-Za-z0-9]{36}" + _R, ("ghp_",)),
    _p("github_oauth_token", "GitHub", "GITHUB_OAUTH_TOKEN", _L + r"gho_[A-Za-z0-9]{36}" + _R, ("gho_",)),
    _p("github_user_to_server_token", "GitHub", "GITHUB_TOKEN", _L + r"ghu_[A-Za-z0-9]{36}" + _R, ("ghu_",)),
    _p("github_server_to_server_token", "GitHub", "GITHUB_TOKEN", _L + r"ghs_[A-Za-z0-9]{36}" + _R, ("ghs_",)),
    _p("github_refresh_token", "GitHub", "GITHUB_REFRESH_TOKEN", _L + r"ghr_[A-Za-z0-9]{36,76}" + _R, ("ghr_",)),
    _p(
        "github_fine_grained_pat",
        "GitHub",
        "GITHUB_TOKEN",
        _L + r"github_pat_[A-Za-z0-9]{22}_[A-Za-z0-9]{59}" + _R,
        ("github_pat_",),
    ),
    _p(
        "gitlab_token",
        "GitLab",
        "GITLAB_TOKEN",
        _L + r"(?:gl(?:pat|dt|rt|ptt|cbt|oas|soat|ffct|imt|agent|ft)-[A-Za-z0-9_\-.]{20,}|GR1348941[\w\-]{20})" + _R,
        ("glpat-", "gldt-", "glrt-", "glptt-", "glcbt-", "gloas-", "glsoat-", "glffct-", "glimt-", "glagent-", "glft-",
         "gr1348941"),
    ),
    _p("npm_token", "npm", "NPM_TOKEN", _L + r"npm_[A-Za-z0-9]{36}" + _R, ("npm_",)),
    _p("pypi_token", "PyPI", "PYPI_TOKEN", _L + r"pypi-AgE[A-Za-z0-9_\-]{60,}" + _R, ("pypi-age",)),
    _p(
        "dockerhub_token",
        "Docker Hub",
        "DOCKERHUB_TOKEN",
        _L + r"dckr_(?:pat|oat)_[A-Za-z0-9_\-]{27,}" + _R,
        ("dckr_",),
    ),
    _p(
        "atlassian_api_token",
        "Atlassian",
        "ATLASSIAN_API_TOKEN",
        _L + r"AT[AC]TT3[A-Za-z0-9_=\-]{100,}" + _R,
        ("atatt3", "atctt3"),
    ),
    _p(
        "linear_api_key",
        "Linear",
        "LINEAR_API_KEY",
        _L + r"lin_(?:api|oauth)_[A-Za-z0-9]{40}" + _R,
        ("lin_api_", "lin_oauth_"),
    ),
    _p(
        "notion_token",
        "Notion",
        "NOTION_TOKEN",
        _L + r"(?:secret_[A-Za-z0-9]{43}|ntn_[A-Za-z0-9]{46})" + _R,
        ("secret_", "ntn_"),
        entropy=3.5,
    ),
    _p(
        "sentry_token",
        "Sentry",
        "SENTRY_AUTH_TOKEN",
        _L + r"(?:sntrys_eyJ[A-Za-z0-9_+/=\-]{40,}|sntryu_[a-f0-9]{64})" + _R,
        ("sntrys_", "sntryu_"),
    ),
    _p("postman_api_key", "Postman", "POSTMAN_API_KEY", _L + r"PMAK-[a-f0-9]{24}-[a-f0-9]{34}" + _R, ("pmak-",)),
    _p(
        "grafana_token",
        "Grafana",
        "GRAFANA_TOKEN",
        _L + r"(?:glsa_[A-Za-z0-9]{32}_[a-f0-9]{8}|glc_[A-Za-z0-9+/]{32,}={0,2})" + _R,
        ("glsa_", "glc_"),
    ),
    _p(
        "newrelic_api_key",
        "New Relic",
        "NEW_RELIC_API_KEY",
        # Insights query and insert keys: 32 characters, `-` and `_` among them (`NRIQ-pD-yUGl9Z3A...`)
        _L + r"(?:NR(?:AK|AA|RA|IQ|IK)-[A-Za-z0-9]{27}|NRJS-[a-f0-9]{19}|NRI[IQ]-[A-Za-z0-9_\-]{32})" + _R,
        ("nrak-", "nraa-", "nrra-", "nriq-", "nrik-", "nrjs-", "nrii-"),
    ),
    # license keys: 40 characters ending `NRAL` (a region such as `eu01xx` may open them)
    _p("newrelic_license_key", "New Relic", "NEW_RELIC_LICENSE_KEY", _L + r"[A-Za-z0-9]{6}[a-fA-F0-9]{30}NRAL" + _R,
       ("nral",), entropy=3.0),
    # mobile application tokens: 42 characters ending `-NRMA` (a region such as `eu01xx` may open them)
    _p("newrelic_mobile_token", "New Relic", "NEW_RELIC_MOBILE_TOKEN", _L + r"[A-Za-z0-9]{42}-NRMA" + _R, ("-nrma",),
       entropy=3.0),
    _p("figma_token", "Figma", "FIGMA_TOKEN", _L + r"figd_[A-Za-z0-9_\-]{40}" + _R, ("figd_",)),
    _p("airtable_token", "Airtable", "AIRTABLE_TOKEN", _L + r"pat[A-Za-z0-9]{14}\.[a-f0-9]{64}" + _R, ("pat",)),
    # --- messaging, email
    _p(
        "slack_token",
        "Slack",
        "SLACK_TOKEN",
        _L + r"(?:xoxe\.)?xox[abposre]-(?:\d+-)?[A-Za-z0-9\-]{8,}" + _R,
        ("xox",),
        entropy=2.8,  # legacy workspace tokens are mostly digits: `xoxa-2-<id>-<id>-<id>-<hex>`
    ),
    _p("slack_app_token", "Slack", "SLACK_APP_TOKEN", _L + r"xapp-\d-[A-Z0-9]+-\d+-[a-z0-9]+" + _R, ("xapp-",)),
    # webhook URLs whose path is the credential: Tines (`<tenant>.tines.com/webhook/<path>/<secret>`) and
    # Zapier catch hooks (`hooks.zapier.com/hooks/catch/<account>/<hook>`)
    _p(
        "tines_webhook_url",
        "Tines",
        "TINES_WEBHOOK_URL",
        r"(?:https?://)?[A-Za-z0-9\-]{1,63}\.tines\.(?:com|io)/webhook/[A-Za-z0-9]{16,}/[A-Za-z0-9]{16,}",
        (".tines.",),
    ),
    _p(
        "zapier_webhook_url",
        "Zapier",
        "ZAPIER_WEBHOOK_URL",
        r"(?:https?://)?hooks\.zapier\.com/hooks/catch/[A-Za-z0-9]{4,}(?:/[A-Za-z0-9]{4,})?/?",
        ("hooks.zapier.com",),
    ),
    _p(
        "slack_webhook_url",
        "Slack",
        "SLACK_WEBHOOK_URL",
        r"(?:https?://)?hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9+/_\-]{20,}",
        ("hooks.slack.com",),
    ),
    _p(
        "telegram_bot_token",
        "Telegram",
        "TELEGRAM_BOT_TOKEN",
        r"(?<![0-9A-Za-z])(?:[0-9]{8,10}:[A-Za-z0-9_\-]{35}|[0-9]{5,16}:A[A-Za-z0-9_\-]{32,34})" + _R,
        (),
        entropy=3.5,
    ),
    _p(
        "discord_bot_token",
        "Discord",
        "DISCORD_BOT_TOKEN",
        _L + r"[MNO][A-Za-z0-9_\-]{23,25}\.[A-Za-z0-9_\-]{6}\.[A-Za-z0-9_\-]{27,38}" + _R,
        (),
        entropy=3.5,
    ),
    _p(
        "discord_webhook_url",
        "Discord",
        "DISCORD_WEBHOOK_URL",
        r"(?:https?://)?(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/\d{16,20}/[A-Za-z0-9_\-]{60,68}",
        ("discord",),
    ),
    _p("twilio_api_key", "Twilio", "TWILIO_API_KEY", r"(?<![A-Za-z0-9])SK[0-9a-fA-F]{32}(?![A-Za-z0-9])", ("sk",)),
    _p(
        "sendgrid_api_key",
        "SendGrid",
        "SENDGRID_API_KEY",
        _L + r"SG\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9_\-]{43}" + _R,
        ("sg.",),
    ),
    _p(
        "mailgun_api_key",
        "Mailgun",
        "MAILGUN_API_KEY",
        _L + r"(?:key-[0-9a-f]{32}|pubkey-[0-9a-f]{32}|[0-9a-h]{32}-[0-9a-h]{8}-[0-9a-h]{8})" + _R,
        (),  # the newer format has no fixed part to filter on
    ),
    _p("mailchimp_api_key", "Mailchimp", "MAILCHIMP_API_KEY", _L + r"[a-f0-9]{32}-us[0-9]{1,2}" + _R, ("-us",)),
    _p("resend_api_key", "Resend", "RESEND_API_KEY", _L + r"re_[A-Za-z0-9]{8}_[A-Za-z0-9]{24}" + _R, ("re_",)),
    # --- payments, commerce
    _p(
        "stripe_secret_key",
        "Stripe",
        "STRIPE_SECRET_KEY",
        _L + r"sk_(?:live|test|prod)_[A-Za-z0-9]{10,99}" + _R,
        ("sk_live_", "sk_test_", "sk_prod_"),
    ),
    _p(
        "stripe_restricted_key",
        "Stripe",
        "STRIPE_RESTRICTED_KEY",
        _L + r"rk_(?:live|test|prod)_[A-Za-z0-9]{10,99}" + _R,
        ("rk_live_", "rk_test_", "rk_prod_"),
    ),
    # (base64: `=` only as padding at the end; `whsec_…=ok=Authorization` is the key and then other text)
    _p("stripe_webhook_secret", "Stripe", "STRIPE_WEBHOOK_SECRET", _L + r"whsec_[A-Za-z0-9+/]{32,}={0,2}" + _R,
       ("whsec_",)),
    _p(
        "shopify_token",
        "Shopify",
        "SHOPIFY_ACCESS_TOKEN",
        _L + r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}" + _R,
        ("shpat_", "shpca_", "shppa_", "shpss_"),
    ),
    _p(
        "square_token",
        "Square",
        "SQUARE_ACCESS_TOKEN",
        _L + r"(?:EAAA[A-Za-z0-9_\-]{60}|sq0atp-[A-Za-z0-9_\-]{22})" + _R,
        ("eaaa", "sq0atp-"),
        entropy=3.0,
    ),
    _p("square_oauth_secret", "Square", "SQUARE_OAUTH_SECRET", _L + r"sq0csp-[A-Za-z0-9_\-]{43}" + _R, ("sq0csp-",)),
    _p(
        "braintree_token",
        "PayPal/Braintree",
        "BRAINTREE_ACCESS_TOKEN",
        # the fixed "access_token$" is left in place: it is a common word, not part of the secret
        r"access_token\$(?P<secret>(?:production|sandbox)\$[a-z0-9]{16}\$[a-f0-9]{32})",
        ("access_token$",),
    ),
    # TeamCity access tokens: a fixed JWT-like header `{"typ": "TCV2"}`, then two base64url parts
    _p(
        "teamcity_token",
        "TeamCity",
        "TEAMCITY_TOKEN",
        _L + r"eyJ0eXAiOiAiVENWMiJ9\.[A-Za-z0-9_\-]{30,60}\.[A-Za-z0-9_\-]{40,64}" + _R,
        ("eyj0exaioiaivenwmij9",),
    ),
    # --- generic formats
    _p(
        "jwt",
        "JWT",
        "JWT",
        # a JWE (header, key, IV, ciphertext, tag; the key is empty for `dir`), then a JWS: a segment may be
        # padded base64 or carry a `\` from string escaping; an unsecured JWS (`alg: none`) ends in its `.`
        _L + r"(?:ey" + _JWT_SEG + r"{8,}=*\." + _JWT_SEG + r"*=*(?:\." + _JWT_SEG + r"{8,}=*){3}" + _R
        + r"|ey" + _JWT_SEG + r"{8,}=*\.ey" + _JWT_SEG + r"{8,}=*\.(?:" + _JWT_SEG + r"{8,}=*" + _R
        + r"|(?![A-Za-z0-9_\-])))",
        ("ey",),
        entropy=3.0,
    ),
    _p(
        "django_secret_key",
        "Django",
        "DJANGO_SECRET_KEY",
        # `startproject` writes `django-insecure-` + 50 of get_random_secret_key()'s alphabet; an edited key
        # may be longer or shorter, and one glued to what follows (`…=sk-ant-…`) is its first 50
        r"(?<![\w\-])django-insecure-(?:[a-z0-9!@#$%^&*(\-_=+)]{40,60}(?![a-z0-9!@#$%^&*(\-_=+)])"
        r"|[a-z0-9!@#$%^&*(\-_=+)]{50})",
        ("django-insecure-",),
        entropy=3.5,
    ),
    _p(
        "mapbox_secret_token",
        "Mapbox",
        "MAPBOX_SECRET_TOKEN",
        _L + r"sk\.eyJ[A-Za-z0-9_\-]{50,}\.[A-Za-z0-9_\-]{20,}" + _R,
        ("sk.eyj",),
    ),
    _p("dropbox_token", "Dropbox", "DROPBOX_TOKEN", _L + r"sl\.(?:u\.)?[A-Za-z0-9_\-]{130,}" + _R, ("sl.",)),
    _p(
        "age_secret_key",
        "age",
        "AGE_SECRET_KEY",
        r"AGE-(?:PLUGIN-[A-Z0-9]{1,32}-|SECRET-KEY-)1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{40,80}",
        ("age-secret-key-1",),
    ),
    _p(
        "openssh_private_key",
        "SSH",
        "SSH_PRIVATE_KEY",
        _pem_block("OPENSSH PRIVATE KEY"),
        ("-----begin openssh private key",),
    ),
    _p(
        "pgp_private_key",
        "PGP",
        "PGP_PRIVATE_KEY",
        _pem_block("PGP PRIVATE KEY BLOCK", limit=40000),
        ("-----begin pgp private key",),
    ),
    _p(
        "private_key",
        "PEM",
        "PRIVATE_KEY",
        _pem_block("(?:[A-Z0-9_]{1,40} ){0,5}PRIVATE KEY(?: BLOCK)?"),
        ("private key",),
        entropy=3.5,
    ),
    _p(
        "putty_private_key",
        "SSH",
        "PUTTY_PRIVATE_KEY",
        r"PuTTY-User-Key-File-[23]:(?:(?!PuTTY-User-Key-File)[\s\S]){10,10000}?Private-MAC: ?[a-f0-9]{40,64}",
        ("putty-user-key-file",),
    ),
)

# Formats of the public scanners' rule sets (gitleaks, Nosey Parker) written from the providers'
# published token formats: a fixed prefix or shape, so no name or cue is needed.
_MORE_PROVIDER_RULES: tuple[Rule, ...] = (
    _p(
        "onepassword_secret_key",
        "1Password",
        "OP_SECRET_KEY",
        _L + r"A3-[A-Z0-9]{6}-(?:[A-Z0-9]{11}|[A-Z0-9]{6}-[A-Z0-9]{5})-[A-Z0-9]{5}-[A-Z0-9]{5}-[A-Z0-9]{5}" + _R,
        ("a3-",),
    ),
    _p(
        "onepassword_service_account_token",
        "1Password",
        "OP_SERVICE_ACCOUNT_TOKEN",
        _B64L + r"ops_eyJ[A-Za-z0-9+/]{100,}={0,3}" + _B64R,
        ("ops_eyj",),
    ),
    _p("adobe_client_secret", "Adobe", "ADOBE_CLIENT_SECRET", _L + r"p8e-[A-Za-z0-9]{32}" + _R, ("p8e-",)),
    _p("artifactory_api_key", "JFrog", "ARTIFACTORY_API_KEY", _L + r"AKCp[A-Za-z0-9]{69}" + _R, ("akcp",)),
    _p(
        "artifactory_reference_token",
        "JFrog",
        "ARTIFACTORY_TOKEN",
        _L + r"cmVmd[A-Za-z0-9]{59}" + _R,
        ("cmvmd",),
        entropy=3.5,
    ),
    _p(
        "authress_access_key",
        "Authress",
        "AUTHRESS_KEY",
        _L + r"(?:sc|ext|scauth|authress)_[A-Za-z0-9]{5,30}\.[A-Za-z0-9]{4,6}\.acc[_\-][A-Za-z0-9\-]{10,32}"
        r"\.[A-Za-z0-9+/_=\-]{30,120}" + _R,
        (".acc_", ".acc-"),
    ),
    _p(
        "aws_bedrock_api_key",
        "AWS",
        "AWS_BEARER_TOKEN_BEDROCK",
        _B64L + r"(?:ABSK[A-Za-z0-9+/]{109,269}={0,2}|bedrock-api-key-YmVkcm9jay5hbWF6b25hd3MuY29t[A-Za-z0-9+/=%&.\-]*)"
        + _B64R,
        ("absk", "bedrock-api-key-"),
    ),
    _p("clickhouse_api_secret", "ClickHouse", "CLICKHOUSE_SECRET", _L + r"4b1d[A-Za-z0-9]{38}" + _R, ("4b1d",),
       entropy=3.5),
    _p("clojars_token", "Clojars", "CLOJARS_TOKEN", _L + r"CLOJARS_[A-Za-z0-9]{60}" + _R, ("clojars_",)),
    _p(
        "defined_networking_token",
        "Defined Networking",
        "DN_API_KEY",
        _L + r"dnkey-[A-Za-z0-9=_\-]{26}-[A-Za-z0-9=_\-]{52}" + _R,
        ("dnkey-",),
    ),
    _p("duffel_token", "Duffel", "DUFFEL_TOKEN", _L + r"duffel_(?:test|live)_[A-Za-z0-9_\-=]{43}" + _R, ("duffel_",)),
    _p(
        "dynatrace_token",
        "Dynatrace",
        "DT_API_TOKEN",
        _L + r"dt0[a-z]\d{2}\.[A-Za-z0-9]{24}\.[A-Za-z0-9]{64}" + _R,
        ("dt0",),
    ),
    _p("easypost_token", "EasyPost", "EASYPOST_API_KEY", _L + r"EZ[AT]K[A-Za-z0-9]{54}" + _R, ("ezak", "eztk")),
    _p(
        "facebook_access_token",
        "Facebook",
        "FACEBOOK_ACCESS_TOKEN",
        _L + r"(?:EAA[A-Za-z0-9]{100,}|\d{15,16}(?:\||%7[Cc]|%)[0-9A-Za-z_\-]{27,40})" + _R,
        ("eaa", "|", "%"),
        entropy=3.0,
    ),
    _p(
        "flutterwave_key",
        "Flutterwave",
        "FLUTTERWAVE_SECRET_KEY",
        _L + r"FLW(?:SECK|PUBK)(?:_TEST)?-(?:[a-hA-H0-9]{32}-X|[a-hA-H0-9]{12})" + _R,
        ("flwseck", "flwpubk"),
    ),
    _p(
        "flyio_token",
        "Fly.io",
        "FLY_API_TOKEN",
        # `fly tokens create` prints the macaroon behind its scheme, `FlyV1 fm2_...`: the scheme goes with it
        _B64L + r"(?:FlyV1[ \t]+)?(?:fo1_[\w\-]{43}|fm1[ar]_[A-Za-z0-9+/]{100,}={0,3}|fm2_[A-Za-z0-9+/]{100,}={0,3})"
        + _B64R,
        ("fo1_", "fm1a_", "fm1r_", "fm2_"),
    ),
    _p("frameio_token", "Frame.io", "FRAMEIO_TOKEN", _L + r"fio-u-[A-Za-z0-9\-_=]{64}" + _R, ("fio-u-",)),
    _p(
        "freemius_secret_key",
        "Freemius",
        "FREEMIUS_SECRET_KEY",
        r"(?<![A-Za-z0-9_\-])sk_(?:(?![\"'`])[!-~]){29}(?![!-~](?<![\"'`,;)=:.]))",
        ("sk_",),
        entropy=3.5,
    ),
    _p(
        "gitlab_cookie",
        "GitLab",
        "GITLAB_SESSION",
        r"_gitlab_session=[0-9a-z]{32}" + _R,
        ("_gitlab_session=",),
    ),
    _p(
        "lob_api_key",
        "Lob",
        "LOB_API_KEY",
        _L + r"(?:live|test)_(?:pub_)?[a-f0-9]{31,35}" + _R,
        ("live_", "test_"),
        entropy=3.0,
    ),
    _p("gocardless_token", "GoCardless", "GOCARDLESS_TOKEN", _L + r"live_[A-Za-z0-9\-_=]{40}" + _R, ("live_",),
       entropy=3.5),
    # base64 of `{"k":"<32>","n":"<name>","id":<n>}`: a one-letter name makes it 67 characters after `eyJrIjoi`
    _p("grafana_api_key", "Grafana", "GRAFANA_API_KEY", _L + r"eyJrIjoi[A-Za-z0-9]{60,400}={0,3}" + _R, ("eyjrijoi",)),
    _p(
        "harness_token",
        "Harness",
        "HARNESS_API_KEY",
        _L + r"(?:pat|sat)\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9]{24}\.[A-Za-z0-9]{20}" + _R,
        ("pat.", "sat."),
    ),
    _p("infracost_token", "Infracost", "INFRACOST_API_KEY", _L + r"ico-[A-Za-z0-9]{32}" + _R, ("ico-",)),
    _p("intra42_secret", "42", "INTRA42_CLIENT_SECRET", _L + r"s-s4t2(?:ud|af)-[a-f0-9]{64}" + _R, ("s-s4t2",)),
    _p("mapbox_token", "Mapbox", "MAPBOX_TOKEN", _L + r"pk\.[A-Za-z0-9_\-]{60,}\.[A-Za-z0-9_\-]{22}" + _R, ("pk.",)),
    _p("maxmind_license_key", "MaxMind", "MAXMIND_LICENSE_KEY", _L + r"[A-Za-z0-9]{6}_[A-Za-z0-9]{29}_mmk" + _R,
       ("_mmk",)),
    _p("octopus_api_key", "Octopus Deploy", "OCTOPUS_API_KEY", _L + r"API-[A-Z0-9]{26}" + _R, ("api-",), entropy=3.0),
    _p("openshift_token", "OpenShift", "OPENSHIFT_TOKEN", _L + r"sha256~[\w\-]{43}" + _R, ("sha256~",)),
    _p(
        "planetscale_token",
        "PlanetScale",
        "PLANETSCALE_TOKEN",
        _L + r"pscale_(?:tkn|oauth|pw)_[\w=.\-]{32,64}" + _R,
        ("pscale_",),
    ),
    _p(
        "plaid_access_token",
        "Plaid",
        "PLAID_ACCESS_TOKEN",
        _L + r"access-(?:sandbox|development|production)-[0-9a-f]{8}-(?:[0-9a-f]{4}-){3}[0-9a-f]{12}" + _R,
        ("access-sandbox-", "access-development-", "access-production-"),
    ),
    _p("prefect_token", "Prefect", "PREFECT_API_KEY", _L + r"pnu_[A-Za-z0-9]{36}" + _R, ("pnu_",)),
    _p("readme_token", "ReadMe", "README_API_KEY", _L + r"rdme_[a-z0-9]{70}" + _R, ("rdme_",)),
    _p("rubygems_token", "RubyGems", "GEM_HOST_API_KEY", _L + r"rubygems_[a-f0-9]{48}" + _R, ("rubygems_",)),
    _p("scalingo_token", "Scalingo", "SCALINGO_API_TOKEN", _L + r"tk-us-[\w\-]{48}" + _R, ("tk-us-",)),
    _p(
        "sendinblue_api_key",
        "Brevo",
        "BREVO_API_KEY",
        _L + r"x(?:keysib|smtpsib)-[a-f0-9]{64}-[A-Za-z0-9]{16}" + _R,
        ("xkeysib-", "xsmtpsib-"),
    ),
    _p("settlemint_token", "SettleMint", "SETTLEMINT_TOKEN", _L + r"sm_(?:aat|pat|sat)_[A-Za-z0-9]{16}" + _R,
       ("sm_aat_", "sm_pat_", "sm_sat_")),
    _p("shippo_token", "Shippo", "SHIPPO_API_TOKEN", _L + r"shippo_(?:live|test)_[a-fA-F0-9]{40}" + _R, ("shippo_",)),
    _p(
        "sidekiq_secret",
        "Sidekiq",
        "BUNDLE_ENTERPRISE__CONTRIBSYS__COM",
        r"(?i:BUNDLE_(?:ENTERPRISE|GEMS)__CONTRIBSYS__COM)[\"']?[ \t]*(?::=|=|:)[ \t]*[\"']?"
        r"(?P<secret>[a-f0-9]{8}:[a-f0-9]{8})" + _R,
        ("contribsys",),
    ),
    # Asana personal access tokens: `<version>/<user gid>[/<app gid>]:<32 hex>`
    _p("asana_pat", "Asana", "ASANA_ACCESS_TOKEN", _L + r"[12]/\d{10,20}(?:/\d{10,20})?:[a-f0-9]{32}" + _R, ("/",)),
    # Twitch chat (IRC) OAuth tokens as its tools print them: `oauth:` and 30 characters
    _p("twitch_oauth_token", "Twitch", "TWITCH_OAUTH_TOKEN", _L + r"oauth:[a-z0-9]{30}" + _R, ("oauth:",), entropy=3.0),
    _p("buildkite_token", "Buildkite", "BUILDKITE_API_TOKEN", _L + r"bk(?:ua|ct)_[a-f0-9]{40}" + _R,
       ("bkua_", "bkct_")),
    # Langfuse secret keys (`pk-lf-` is the public half)
    _p("langfuse_secret_key", "Langfuse", "LANGFUSE_SECRET_KEY",
       _L + r"sk-lf-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}" + _R, ("sk-lf-",)),
    _p(
        "sourcegraph_token",
        "Sourcegraph",
        "SRC_ACCESS_TOKEN",
        _L + r"sgp_(?:(?:[a-fA-F0-9]{16}|local)_)?[a-fA-F0-9]{40}" + _R,
        ("sgp_",),
    ),
    _p(
        "teams_webhook_url",
        "Microsoft Teams",
        "TEAMS_WEBHOOK_URL",
        # the current form (`<tenant>.webhook.office.com/webhookb2/`) and the older `outlook.office.com/webhook/`
        r"(?i)(?:https://)?(?:[a-z0-9\-]+\.webhook\.office\.com/webhookb2|outlook\.office(?:365)?\.com/webhook)/"
        r"[a-z0-9\-]{36}@[a-z0-9\-]{36}/IncomingWebhook/[a-z0-9]{32}/[a-z0-9\-]{36}(?:/[A-Za-z0-9_\-]{10,})?",
        ("webhook.office.com", "outlook.office"),
    ),
    _p(
        "twitter_bearer_token",
        "Twitter",
        "TWITTER_BEARER_TOKEN",
        _L + r"A{22}[A-Za-z0-9%]{80,100}" + _R,
        ("aaaaaaaaaaaaaaaaaaaaaa",),
    ),
    _p("typeform_token", "Typeform", "TYPEFORM_TOKEN", _L + r"tfp_[A-Za-z0-9\-_.=]{59}" + _R, ("tfp_",)),
    _p(
        "yandex_token",
        "Yandex",
        "YANDEX_TOKEN",
        _L + r"(?:t1\.[A-Za-z0-9_\-]+=*\.[A-Za-z0-9_\-]{86}=*|AQVN[A-Za-z0-9_\-]{35,38}|YC[A-Za-z0-9_\-]{38})" + _R,
        ("t1.", "aqvn", "yc"),
        entropy=3.5,
    ),
    _p("adafruit_io_key", "Adafruit IO", "ADAFRUIT_IO_KEY", _L + r"aio_[A-Za-z0-9]{28}" + _R, ("aio_",), entropy=3.0),
    _p(
        "aws_session_token",
        "AWS",
        "AWS_SESSION_TOKEN",
        _B64L + r"(?:FwoGZXIvYXdz|IQoJb3JpZ2lu)[A-Za-z0-9+/]{100,}={0,2}" + _B64R,
        ("fwogzxivyxdz", "iqojb3jpz2lu"),
    ),
    _p(
        "amazon_mws_token",
        "AWS",
        "MWS_AUTH_TOKEN",
        _L + r"amzn\.mws\.[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}" + _R,
        ("amzn.mws.",),
    ),
    _p("bitbucket_app_password", "Bitbucket", "BITBUCKET_APP_PASSWORD", _L + r"ATBB[A-Za-z0-9_=.\-]{28,}" + _R,
       ("atbb",), entropy=3.0),
    _p("crates_io_token", "crates.io", "CARGO_REGISTRY_TOKEN", _L + r"cio[A-Za-z0-9]{32}" + _R, ("cio",),
       entropy=3.5),
    _p("dependency_track_key", "Dependency-Track", "DTRACK_API_KEY", _L + r"odt_[A-Za-z0-9]{32,}" + _R, ("odt_",),
       entropy=3.0),
    _p("jina_api_key", "Jina", "JINA_API_KEY", _L + r"jina_[a-f0-9]{32}[A-Za-z0-9_\-]{28}" + _R, ("jina_",)),
    _p("mapbox_temporary_token", "Mapbox", "MAPBOX_TOKEN", _L + r"tk\.eyJ[A-Za-z0-9_\-]{50,}\.[A-Za-z0-9_\-]{20,}" + _R,
       ("tk.eyj",)),
    _p(
        "newrelic_pixie_key",
        "New Relic",
        "PIXIE_API_KEY",
        _L + r"px-(?:api|dep)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}" + _R,
        ("px-api-", "px-dep-"),
    ),
    _p("nuget_api_key", "NuGet", "NUGET_API_KEY", _L + r"oy2[a-z0-9]{43}" + _R, ("oy2",), entropy=3.5),
    _p(
        "salesforce_access_token",
        "Salesforce",
        "SALESFORCE_ACCESS_TOKEN",
        _L + r"00[A-Za-z0-9]{13}![A-Za-z0-9._]{80,}" + _R,
        ("!",),
        entropy=3.5,
    ),
    _p("segment_token", "Segment", "SEGMENT_TOKEN", _L + r"sgp_[A-Za-z0-9]{64}" + _R, ("sgp_",)),
    _p("sonarqube_token", "SonarQube", "SONAR_TOKEN", _L + r"sq[pua]_[a-f0-9]{40}" + _R, ("sqp_", "squ_", "sqa_")),
    # Azure DevOps PATs since 2024: 84 characters with the fixed `AZDO` signature at 77-80
    _p("azure_devops_pat", "Azure DevOps", "AZURE_DEVOPS_PAT", _L + r"[A-Za-z0-9]{76}AZDO[A-Za-z0-9]{4}" + _R,
       ("azdo",), entropy=3.5),
    _p("stackhawk_key", "StackHawk", "HAWK_API_KEY", _L + r"hawk\.[A-Za-z0-9_\-]{20}\.[A-Za-z0-9_\-]{20}" + _R,
       ("hawk.",)),
    _p("vault_recovery_token", "HashiCorp Vault", "VAULT_TOKEN", _L + r"hvr\.[A-Za-z0-9_\-]{24,}" + _R, ("hvr.",)),
    _p(
        "pem_private_key_base64",
        "PEM",
        "PRIVATE_KEY",
        # base64 of "-----BEGIN ... PRIVATE KEY-----" (Kubernetes secrets, CI variables)
        _B64L + r"LS0tLS1CRUdJTi[A-Za-z0-9+/]{0,40}(?:UFJJVkFURSBLRV|BSSVZBVEUgS0VZ|QUklWQVRFIEtFW)"
        r"[A-Za-z0-9+/]{40,}={0,2}(?![A-Za-z0-9+/_\-])",
        ("ls0tls1crudjti",),
    ),
    _p(
        "jwt_base64",
        "JWT",
        "JWT",
        _B64L + r"ZXlK[A-Za-z0-9+/]{60,}={0,2}" + _B64R,
        ("zxlk",),
        entropy=3.5,
    ),
    # `tskey-<kind>-<key id>-<secret>`: api, auth, client, scim, webhook keys
    _p("tailscale_key", "Tailscale", "TAILSCALE_API_KEY",
       _L + r"tskey-[a-z]{3,10}-[A-Za-z0-9]{6,}-[A-Za-z0-9]{12,}" + _R, ("tskey-",)),
    # Zoho's OAuth access and refresh tokens: `1000.<32 hex>.<32 hex>`
    _p("zoho_oauth_token", "Zoho", "ZOHO_TOKEN", _L + r"1000\.[a-f0-9]{32}\.[a-f0-9]{32}" + _R, ("1000.",)),
    # PubNub's publish and subscribe keys (a UUID after the kind) and its secret key
    _p("pubnub_key", "PubNub", "PUBNUB_KEY",
       _L + r"(?:pub|sub)-c-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}" + _R, ("pub-c-", "sub-c-")),
    _p("pubnub_secret_key", "PubNub", "PUBNUB_SECRET_KEY", _L + r"sec-c-[A-Za-z0-9]{40,64}" + _R, ("sec-c-",)),
)

_CONTEXT_RULES: tuple[Rule, ...] = (
    _c(
        "aws_secret_access_key",
        "AWS",
        "AWS_SECRET_ACCESS_KEY",
        _B64L + r"[A-Za-z0-9/+]{40}" + _B64R,
        ("aws", "secret_access_key", "secretaccesskey", "akia", "asia"),
        window=200,
    ),
    _c(
        "cloudflare_api_token",
        "Cloudflare",
        "CLOUDFLARE_API_TOKEN",
        _L + r"[A-Za-z0-9_\-]{40}" + _R,
        ("cloudflare", "cf_api"),
    ),
    _c(
        "cloudflare_global_api_key",
        "Cloudflare",
        "CLOUDFLARE_API_KEY",
        _L + r"[a-f0-9]{37}" + _R,
        ("cloudflare", "cf_api"),
    ),
    _c(
        "azure_openai_api_key",
        "Azure",
        "AZURE_OPENAI_API_KEY",
        _L + r"(?:[a-f0-9]{32}|[A-Za-z0-9]{84})" + _R,
        ("azure",),
    ),
    _c("mistral_api_key", "Mistral", "MISTRAL_API_KEY", _L + r"[A-Za-z0-9]{32}" + _R, ("mistral",)),
    _c("twilio_auth_token", "Twilio", "TWILIO_AUTH_TOKEN", _L + r"[a-f0-9]{32}" + _R, ("twilio",)),
    _c(
        "alibaba_access_key_secret",
        "Alibaba Cloud",
        "ALIBABA_CLOUD_ACCESS_KEY_SECRET",
        _L + r"[A-Za-z0-9]{30}" + _R,
        ("ltai", "alibaba", "aliyun", "accesskeysecret", "access_key_secret", "阿里"),
    ),
    _c(
        "tencent_secret_key",
        "Tencent Cloud",
        "TENCENTCLOUD_SECRET_KEY",
        _L + r"[A-Za-z0-9]{32}" + _R,
        ("akid", "tencent", "secretkey", "secret_key", "腾讯"),
    ),
    _c(
        "heroku_api_key_uuid",
        "Heroku",
        "HEROKU_API_KEY",
        _L + r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}" + _R,
        ("heroku",),
        window=60,
    ),
    _c("paypal_client_secret", "PayPal", "PAYPAL_CLIENT_SECRET", _L + r"E[A-Za-z0-9_\-]{79}" + _R, ("paypal",)),
    _c("cohere_api_key", "Cohere", "COHERE_API_KEY", _L + r"[A-Za-z0-9]{40}" + _R, ("cohere",)),
    _c("okta_api_token", "Okta", "OKTA_API_TOKEN", _L + r"00[A-Za-z0-9_=\-]{40}" + _R, ("okta",)),
    # names the providers' documentation gives the key, when the value is a bare hex string: SonarQube's
    # `sonar.login` (a user token before `sq*_` prefixes), Code Climate's test reporter id, a Jenkins
    # API token or CSRF crumb (`Jenkins-Crumb:` header)
    _c("sonarqube_login_token", "SonarQube", "SONAR_LOGIN", _L + r"[a-f0-9]{40}" + _R,
       ("sonar.login", "sonarlogin", "sonar_login"), window=24),
    _c("codeclimate_reporter_id", "Code Climate", "CC_TEST_REPORTER_ID", _L + r"[a-f0-9]{64}" + _R,
       ("cc_test_reporter_id", "codeclimate_repo_token"), window=24),
    _c("jenkins_token", "Jenkins", "JENKINS_TOKEN", _L + r"[a-f0-9]{32,36}" + _R,
       ("jenkins-crumb", "jenkins_crumb", "jenkins_token", "jenkins_api_token", "jenkins-api-token"), window=24),
    # pre-1.10 Vault tokens: service `s.`, batch `b.`, recovery `r.` (batch tokens run long)
    _c("vault_legacy_token", "HashiCorp Vault", "VAULT_TOKEN", _L + r"[sbr]\.[A-Za-z0-9_\-]{24,200}" + _R,
       ("vault", "hashicorp")),
    _c(
        "kubernetes_bootstrap_token",
        "Kubernetes",
        "KUBEADM_TOKEN",
        _L + r"[a-z0-9]{6}\.[a-z0-9]{16}" + _R,
        ("kubeadm", "bootstrap", "--token", "kubernetes", "k8s", "kubelet", "join"),
        entropy=2.5,
    ),
)

# Assignments in the languages and config formats people paste: `export DEEPSEEK_API_KEY=...`,
# `.env`, YAML/TOML/INI/HCL `token = ...`, JSON `"apiKey": "..."`, Python/JS/Java/C#/Kotlin
# `apiToken = "..."`, Go `var xToken string = "..."` / `xToken := "..."`, PHP `$xToken .= "..."`,
# Makefile `X_TOKEN ::= / :::= / ?= / += "..."`, Perl/Ruby/logstash `"xToken" => "..."`, call pairs
# `System.setProperty("X_TOKEN", "...")`, JS `x_token || "..."`. The name must be secret-like.
_ASSIGNMENT_RE = (
    r"(?:(?<=\$)|(?<![A-Za-z0-9_.$\-]))(?P<name>(?:[A-Za-z0-9_][A-Za-z0-9_.\-]{0,80}?)?"
    r"(?i:key|token|secret|passw(?:or)?d|passphrase|pwd|pass|auth|credentials?|creds?)[A-Za-z0-9_]{0,40})"
    r"(?P<nq>\\?[\"'])?"
    # a type or a subscript between name and operator: Go `xToken string =`, Kotlin/TS `xToken: String =`,
    # Rust `password: &str =`, C `char secret[25] =`, Python `os.environ["API_KEY"] =`
    r"(?P<typed>(?:[ \t]+(?:string|String|str|&str|const|final)|[ \t]*:[ \t]*&?[A-Za-z_][\w<>?\[\].]{0,30}|"
    r"\[\d{0,4}\]|(?<=[\"'])\])"
    r"(?=[ \t]*=[ \t]*@?[\"'`]))?"
    r"[ \t]*(?P<op>:{1,3}=|\?\?=|\?=|\+=|\.=|={2,3}|!={1,2}|=>|->|\|\||=|:|：|,(?=[ \t]*\\?[\"'`]))[ \t]*\\?"
    r"@?"  # Objective-C and C# verbatim strings: `@"…"`
    # a quoted value may be wrapped by a terminal onto following lines of base64
    # (up to 4 KB: an Entra refresh token or a Docker `auth` holding a key file runs past 1 KB)
    r"(?:(?P<q>[\"'`])(?P<qv>(?:(?!(?P=q))[^\n]){1,4096}?(?:\r?\n[A-Za-z0-9+/=_\-.]{1,1024}?)*)\\?(?P=q)|"
    r"[\"'`]?(?P<v>[^\s\"'`,;<>\\]{1,4096}))"
)
# A literal handed to a secret-named setter, builder or constructor (`ds.setPassword("…")`,
# `Client.builder().apiKey("…")`, C++ `std::string secret("…")`), and one compared with a secret-named
# variable from the left (`if ("…" == password)`): the assignment's checks decide.
_SECRET_WORDS = r"(?i:token|secret|passw(?:or)?d|passphrase|pwd|api_?key|access_?key|private_?key|credentials?)"
_SETTER_CALL_RE = (
    r"(?<![A-Za-z0-9_$])(?P<name>[A-Za-z_]{0,40}?" + _SECRET_WORDS + r"[A-Za-z0-9_]{0,20})"
    r"(?P<op>\()[ \t]*@?(?P<q>[\"'`])(?P<qv>(?:(?!(?P=q))[^\n\\]){1,512})(?P=q)[ \t]*[),]"
)
_COMPARED_LITERAL_RE = (
    r"(?P<q>[\"'`])(?P<qv>(?:(?!(?P=q))[^\n\\]){1,512})(?P=q)[ \t]*(?P<op>={2,3}|!={1,2})[ \t]*"
    r"(?:[A-Za-z_$][\w$]*(?:\.|->|::))*(?P<name>[A-Za-z_]{0,40}?" + _SECRET_WORDS + r"[A-Za-z0-9_]{0,20})\b"
)
# A setting written as a name field and a value field of one entry: Kubernetes and ECS `env` lists
# (`- name: DB_PASSWORD` / `value: "…"`, `{"Name": "DB_PASSWORD", "Value": "…"}`), CloudFormation parameters
# (`"ParameterKey": "DBPassword", "ParameterValue": "…"`), key/value settings (`{"key": "smtp.password",
# "value": "…"}`) and their XML form (`<key>pro_password</key><value>…</value>`, `<name>`…). The name field's
# value must be secret-like; the value field follows in the same entry.
_NAME_VALUE_PAIR_RE = (
    r"(?i)(?<![\w\-])[\"']?(?:name|key|parameterkey|parameter_name|variable)[\"']?[ \t]*[:=][ \t]*[\"']?"
    r"(?P<name>[A-Za-z0-9_.\-]{1,80}?)[\"']?[ \t]*,?\s{0,80}?[\"']?(?:value|parametervalue|parameter_value)[\"']?"
    r"[ \t]*[:=][ \t]*(?:(?P<q>[\"'])(?P<qv>(?:(?!(?P=q))[^\n]){1,4096})(?P=q)|(?P<v>[^\s\"',;}]{1,4096}))"
)
_XML_NAME_VALUE_RE = (
    r"(?i)<(?P<tag>key|name)>[ \t]*(?P<name>[A-Za-z0-9_.\-]{1,80})[ \t]*</(?P=tag)>\s{0,80}?<value>[ \t]*"
    r"(?P<v>[^\s<]{1,4096})[ \t]*</value>"
)
# A `NAME=value` setting on its own line (`.env`, shell `export`, `docker run -e`, a `.env` inside a JSON
# string): the value is everything up to the next space, punctuation included (`PASSWORD=Zv7,qH~8'c`).
_ENV_LINE_RE = (
    r"(?m)(?:^[ \t]*(?:export[ \t]+|set[ \t]+|\$env:)?|(?<=[ \t]-e[ \t])|(?<=--env[ \t])|(?<=--env=)|(?<=\\n)|"
    r"(?<=[{,][ \t]\")|(?<=: \"))"
    # (a backtick that no other closes on the line is the value's first character: `PASSWORD=`123QWERasdf`)
    r"(?P<name>[A-Za-z_][A-Za-z0-9_.\-]{0,120})=(?P<v>(?:[^\s\"'`]|`(?![^`\n]*`))(?:[^\s\\]|\\[^nrt\s]){0,4095})"
)
# XML: `<apiToken>...</apiToken>` (the value may sit on its own line), `<add key="ClearTextPassword"
# value="..." />` (NuGet, .NET appSettings), `<entry name="xToken" value="..."/>`.
_XML_ELEMENT_RE = (
    r"<(?P<name>(?:[A-Za-z_][\w.\-]{0,80}?)?"
    r"(?i:key|token|secret|passw(?:or)?d|passphrase|pwd|pass|auth|credentials?)[\w]{0,40})(?:[ \t][^<>\n]{0,200})?>"
    r"[ \t]*(?:\r?\n[ \t]*)?(?P<v>[^<>\s]{1,1024})[ \t]*(?:\r?\n[ \t]*)?</(?P=name)>"
)
# A secret-named element whose text is several words on one line: Jenkins' credentials.xml writes a stored
# secret as `<secret>{AQAAABAAA...}</secret>`, and a pasted one often keeps a label inside the braces
# (`<apiToken>{prod 9f2c... }</apiToken>`). The span runs from the first to the last random word.
_XML_WORDS_RE = (
    r"<(?P<name>(?:[A-Za-z_][\w.\-]{0,80}?)?"
    r"(?i:token|secret|passw(?:or)?d|passphrase|api[_\-]?key|access[_\-]?key)[\w]{0,40})(?:[ \t][^<>\n]{0,200})?>"
    r"(?P<c>[^<>\n]{0,1024}?[ \t][^<>\n]{0,1024}?)</(?P=name)>"
)
_XML_WORD_RE = re.compile(r"[^\s{}()\[\],;\"']+")


def _extract_xml_words(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    found = [
        w for w in _XML_WORD_RE.finditer(text, m.start("c"), m.end("c"))
        if len(w.group()) >= 12 and not _DOMAIN_RE.fullmatch(w.group()) and not _PATH_RE.fullmatch(w.group())
        and _plausible(w.group(), "token") and _random_enough(w.group(), relaxed=True)
    ]
    if not found:
        return None
    return _Hit(found[0].start(), found[-1].end(), key_name=m.group("name"))


_XML_KEY_VALUE_RE = (
    r"(?i)\b(?:key|name)[ \t]*=[ \t]*(?P<nq>[\"'])(?P<name>[^\"'<>\n]{1,80})(?P=nq)[ \t]+value[ \t]*=[ \t]*"
    r"(?P<q>[\"'])(?P<qv>[^\"'<>\n]{1,1024})(?P=q)"
)
_CLI_FLAG_RE = (
    r"(?<![\w\-])--?(?P<name>(?i:api[-_]?key|access[-_]token|auth[-_]token|token|passwd|secret|passphrase|"
    r"client[-_]secret|pat|(?:proxy-)?tlspassword|(?:[a-z0-9]+[-_])*password|storepass|keypass))(?:=|[ \t]+)"
    r"(?:[\"'](?P<qv>[^\"'\n]{1,512})[\"']|(?P<v>[^\s\"'`]{1,512}))"
)
_AUTH_HEADER_RE = (
    r"(?i)(?<![A-Za-z0-9_\-])(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?"
    r"(?:(?P<scheme>bearer|token|bot|basic|digest|apikey|sso-key|api-token)\s+)?(?P<secret>[A-Za-z0-9._~+/=:@\-]{8,4096})"
)
_BEARER_RE = r"(?i)(?<![A-Za-z0-9_\-])(?P<scheme>bearer)\s+(?P<secret>[A-Za-z0-9._~+/\-]{16,4096}=*)"
# Docker's config.json (`"auths": {"registry": {"auth": "<base64 of user:password>"}}`), also JSON-escaped inside
# a string (a GitLab runner's DOCKER_AUTH_CONFIG)
_DOCKER_AUTH_RE = (r"(?<![A-Za-z0-9_\-])\\?[\"']auth\\?[\"']\s*:\s*\\?[\"']"
                   r"(?P<secret>[A-Za-z0-9+/]{8,4096}={0,2})\\?[\"']")
# `scheme://user:password@host`, and Go's MySQL DSN `user:password@tcp(host:3306)/db` (no scheme). The
# password is taken as people paste it, unencoded: `#`, `?`, `'`, `@` and `/` inside (the last `@` before
# the host ends it); the host may be an IPv6 literal (`@[::1]`).
_USERINFO = r"(?P<user>[^\s:@/?#\[\]\"'`<>]{0,64}):(?P<secret>[^\s\"`<>]{1,256})@"
_URL_CREDENTIALS_RE = (
    r"(?i)(?<![A-Za-z0-9+.\-])(?P<scheme>[a-z][a-z0-9+.\-]{1,20})://" + _USERINFO
    + r"(?P<host>[A-Za-z0-9][A-Za-z0-9.\-]*|\[[0-9A-Fa-f:.]{2,45}\])"
)
_DSN_CREDENTIALS_RE = r"(?<![\w.\-:/@])(?P<scheme>)" + _USERINFO + r"(?P<host>tcp|unix)(?=\()"
# `curl -u user:password`, `--user 'user:pass'`, `--user=user:pass`, `-u "user":"pass"`, `--proxy-user`/`-U`:
# user and password go together (`curl -u` takes them as one argument, and the user alone often is an API key id).
# (A key as the user runs to a few hundred characters: OAuth refresh tokens, JWTs, base64 of a key pair;
# the bounds only stop a runaway match.)
_CURL_USER_RE = (
    r"(?<![\w\-])(?:-u|--user|-U|--proxy-user)(?:=|[ \t]+)(?P<arg>"
    r"(?P<wq>[\"'])(?P<wuser>[^\s:\"']{0,1024}):(?P<wpass>[^\"'\n]{0,1024})(?P=wq)|"  # 'user:pass', ":pass", "key:"
    r"(?P<quser>\"[^\"\n:]{1,1024}\"|'[^'\n:]{1,1024}'):(?P<qpass>\"[^\"\n]{1,1024}\"|'[^'\n]{1,1024}')|"  # "u":"p"
    r"(?P<user>[^\s:\"']{1,1024}):(?P<pass>'[^'\n]{1,1024}'|\"[^\"\n]{1,1024}\"|[^\s\"']{0,1024}))"  # user:pass
)

_CUE_VALUE = r"(?P<q>[`\"'“‘「『(]?)(?P<value>[!-~]{1,2048})"

_PASSWORD_CUE_RE = (
    r"(?i)(?P<cue>(?<![A-Za-z0-9_\-])(?:pass(?:word|wd|phrase|code)s?|pass(?=[ \t]*[:：=])|pwd|pw|pin\s?code)|"
    r"密码|密碼|口令|密匙|通行码|パスワード|パスコード|暗証番号|合言葉|비밀번호|패스워드)(?![A-Za-z0-9_\-])"
    + _TARGET + r"[\"']?"
    + r"(?:\*\*?|__?)?" + _CUE_SEP + _CUE_VALUE
)
_TOKEN_CUE_RE = (
    r"(?i)(?P<cue>(?<![A-Za-z0-9_\-])(?:(?:(?:api|access|secret|auth|bearer|bot|refresh|private|app|client|"
    r"personal\s+access|license)[ \t_\-]?)?(?:keys?|tokens?|secrets?)|apikey|credentials?)|"
    r"密钥|秘钥|私钥|令牌|授权码|凭证|凭据|秘密鍵|(?:API|アクセス|シークレット|認証)キー|(?:アクセス)?トークン)"
    r"(?![A-Za-z0-9_\-])" + _TARGET + r"[\"']?" + _CUE_SEP + _CUE_VALUE
)

# Passwords passed positionally: `.netrc` (`machine h login u password p`), `psexec -u u -p p`,
# `mysql -pPASSWORD`, .NET `new NetworkCredential("u", "p")` / `DirectoryEntry(path, "u", "p")`, Python
# `HTTPBasicAuth("u", "p")` / `auth=("u", "p")`.
_STR = r"(?:\"[^\"\n]{0,256}\"|'[^'\n]{0,256}')"
_NETRC_RE = (
    r"(?i)\bmachine[ \t]+\S{1,256}(?:[ \t]+|[ \t]*\r?\n[ \t]*)(?:login[ \t]+\S{1,256}(?:[ \t]+|[ \t]*\r?\n[ \t]*))?"
    r"password[ \t]+(?P<netrc>[^\s\"']{1,256})"
)
_GROOVY_PASSWORD_RE = r"(?i)(?<![\w.\-])(?:password|passwd)[ \t]+(?P<gq>[\"'])(?P<groovy>[^\"'\n]{3,256})(?P=gq)"
# A command whose short flag takes the password as its next argument: `psexec -p`, `sshpass -p`,
# `docker login -p`, `redis-cli -a`, `sqlcmd -P`, `ldapsearch -w`, `mosquitto_pub -P`, `zip -P`,
# `rdesktop -p`; xfreerdp's `/p:`. mysql's `-p` takes it attached (`-pS3cret`, `-p'S3cret'`): there a
# separate word after `-p` is the database.
_COMMAND_FLAGS: tuple[tuple[str, str], ...] = (
    (r"psexec(?:64)?(?:\.exe)?", "-p"),
    (r"sshpass", "-p"),
    (r"(?:docker|podman|buildah|skopeo|nerdctl|oras|crane)\b[^\n]{0,40}?\blogin", "-p"),
    (r"helm[ \t]+registry[ \t]+login", "-p"),
    (r"redis-cli|keydb-cli|valkey-cli", "-a"),
    (r"sqlcmd(?:\.exe)?|osql|bcp", "-P"),
    (r"ldap(?:search|modify|add|delete|whoami|passwd|compare|modrdn)", "-w"),
    (r"mosquitto_(?:pub|sub|rr)", "-P"),
    (r"zip|unzip", "-P"),
    (r"mongo|mongosh|mongodump|mongorestore|mongoexport|mongoimport|rdesktop", "-p"),
)
_COMMAND_PASSWORD_RE = (
    r"(?<![\w\-.])(?P<command>"
    + "|".join(f"(?i:{c})(?:[ \\t][^\\n]{{0,200}}?)?[ \\t]{f}" for c, f in _COMMAND_FLAGS)
    + r")[ \t]+(?P<pq>[\"']?)(?P<psexec>[^\s\"'\-][^\s\"']{0,255})(?P=pq)"
    r"|(?<![\w\-.])(?i:xfreerdp3?)\b[^\n]{0,200}?[ \t][/\-]p:(?P<rq>[\"']?)(?P<rdp>[^\s\"']{1,256})(?P=rq)"
)
_MYSQL_RE = (
    r"(?i)\b(?:mysql|mysqldump|mysqladmin|mariadb)\b[^\n]{0,200}?[ \t]-p"
    r"(?:(?P<mq>[\"'])(?P<mysqlq>[^\"'\n]{1,256})(?P=mq)|(?P<mysql>[^\s\"'\-][^\s\"']{0,255}))"
)
_CREDENTIAL_CALL_RE = (
    r"\b(?:NetworkCredential|HTTPBasicAuth|HTTPDigestAuth|UsernamePasswordCredentials|PasswordAuthentication|"
    r"BasicAuth|auth)[ \t]*=?[ \t]*\([ \t]*" + _STR + r"[ \t]*,[ \t]*(?P<q2>[\"'])(?P<arg2>[^\"'\n]{1,256})(?P=q2)"
    r"|\bDirectoryEntry[ \t]*\(\s{0,40}" + _STR + r"\s{0,40},\s{0,40}" + _STR
    + r"\s{0,40},\s{0,40}(?P<q3>[\"'])(?P<arg3>[^\"'\n]{1,256})(?P=q3)"
)


_COMMAND_START_RE = re.compile(r"(?:^|[`$#>(;|&:\"']|\bsudo|\bexec|(?i:\bcmd(?:\.exe)?[ \t]+/c))[ \t]*$")


def _starts_a_command(text: str, start: int) -> bool:
    """The command begins its line or follows a prompt, a quote or backtick, a pipe, `;`, `&&`, `sudo`,
    `cmd /c` or a colon (`system("psexec …`)."""
    line_start = text.rfind("\n", 0, start) + 1
    return bool(_COMMAND_START_RE.search(text[line_start:start]))


def _command_flag(command: str) -> str:
    """`sshpass -p` for a match from `/usr/bin/sshpass -p`, `docker login -p` from `docker login -u x -p`."""
    words = command.split()
    name = words[0].rsplit("/", 1)[-1].lower()
    if name in ("docker", "podman", "buildah", "skopeo", "nerdctl", "oras", "crane", "helm"):
        name += " login"
    return f"{name} {words[-1]}"


def _extract_positional_password(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    groups = m.groupdict()
    group = next(
        g for g in ("netrc", "groovy", "psexec", "rdp", "mysql", "mysqlq", "arg2", "arg3") if groups.get(g) is not None
    )
    start, end = m.span(group)
    value = text[start:end]
    if len(value) < 3 or _is_placeholder(value) or _REFERENCE_RE.search(value):
        return None
    if value.startswith("$") and not any(c.isdigit() for c in value):
        return None
    if group == "groovy" and not _plausible(value, "password"):
        return None
    if group == "psexec":
        key_name = _command_flag(m.group("command"))
        # "I'll zip -P the files later", "zip -P requires a password": prose naming a command (zip is a word too)
        if not _plausible(value, "password") and (not _starts_a_command(text, m.start()) or (
                value.isalpha() and value.islower() and key_name in ("zip -P", "unzip -P"))):
            return None
    elif group == "rdp":
        key_name = "xfreerdp /p:"
    else:
        key_name = {"netrc": ".netrc password", "mysql": "mysql -p", "mysqlq": "mysql -p"}.get(group, "password")
    return _Hit(start, end, key_name=key_name, service=_known_service_near(text, m.start()))


# An ODBC / ADO.NET connection string quotes a value holding `;` in braces (`}}` is a literal `}`):
# `Uid=app;Pwd={Xk9#mQ2;vLp7!zR4};`. Unquoted and quoted values are the cue rules' already.
_BRACED_PASSWORD_RE = (
    r"(?i)(?<![A-Za-z0-9_\-])(?P<cue>pwd|password)[ \t]*=[ \t]*\{(?P<value>(?:[^}\n]|\}\}){1,256})\}(?!\})"
)


def _extract_braced_password(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    """The braces' content; `Pwd={password}` and `{self.pwd}` (a template, code) are no password."""
    start, end = m.span("value")
    if not _plausible(text[start:end].replace("}}", "}"), "password"):
        return None
    return _Hit(start, end, key_name=m.group("cue"), service=_known_service_near(text, m.start()))


# The cue after the value: "Use 65iekx9l8d3xt02lohc08kpbmv06u8lu as the key", "`x` is my token".
_TRAILING_CUE_RE = (
    r"(?<![^\s\"'`(（：:，,=])(?P<q>[`\"']?)(?P<value>[!-~]{8,256}?)(?P=q)[ \t]+(?i:as|is|was|=)[ \t]+"
    r"(?:(?i:the|my|our|your|a|an|its|their|new)[ \t]+)?(?:[A-Za-z0-9.\-]{1,30}[ \t]+){0,3}?"
    r"(?P<cue>(?i:(?:api[ \t_\-]?)?(?:keys?|tokens?|secrets?|passwords?|passphrase|credentials?)))(?![A-Za-z0-9_\-])"
)
# A line that names the secret and ends in a colon, then the value alone on its line, maybe after a blank
# line: Jenkins' setup wizard ("Please use the following password to proceed to installation:", a blank
# line, the password), tools and people that print a secret under a label.
_LABEL_LINE_RE = (
    r"(?im)^[^\n]{0,160}?(?<![A-Za-z0-9_\-])(?P<cue>pass(?:word|phrase)|pwd|(?:api[ \t_\-]?)?(?:key|token|secret))s?"
    r"(?![A-Za-z0-9_\-])[^\n:：]{0,80}[:：][ \t]*\r?\n(?:[ \t]*\r?\n)?[ \t]*(?P<value>[!-~]{6,256})[ \t]*\r?$"
)


def _extract_label_line(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    start, end = m.span("value")
    cue = m.group("cue").lower()
    strength: Strength = "password" if cue.startswith(("pass", "pwd")) else "token"
    if not _plausible(text[start:end], strength):
        return None
    return _Hit(start, end, key_name=cue, service=_known_service_near(text, m.start("cue")))


# A key pasted with no name or cue: long, random (mixed classes, high entropy, no word pieces).
_BARE_TOKEN_RE = (
    # (base64 may start with `+` or `/`, base64url with `-`; a key generated from a loose class with `.` or `~`)
    r"(?<![A-Za-z0-9_+/=\-.~\\$%@:])(?P<value>[A-Za-z0-9_\-+/.~][A-Za-z0-9_\-+/=.~:]{11,1023})(?![A-Za-z0-9_+/=\-.~\\@:])"
)


_SETTING_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_SNAKE_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+")


def _extract_trailing_cue(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    start, end = m.span("value")
    if not m.group("q"):
        start, end = _trim(text, start, end)
    setting = _SETTING_NAME_RE.match(text, start, end)
    if setting is not None:  # `PATH=/usr/bin = password: …`: a setting's value is the candidate, not its name
        start = setting.end()
    value = text[start:end]
    if not value or _PATH_RE.fullmatch(value):
        return None
    if _SNAKE_NAME_RE.fullmatch(value) and is_secret_name(value):
        return None  # `variable_password0 = password;`: a variable named for the secret, assigned another
    cue = m.group("cue").lower()
    strength: Strength = "password" if "pass" in cue else "token"
    if not _plausible(value, strength, quoted=bool(m.group("q"))):
        return None
    if strength == "token" and not (
        value.isdigit() or _UUID_RE.fullmatch(value) or _random_enough(value, relaxed=True)
    ):
        return None
    return _Hit(start, end, key_name=re.sub(r"[\s_-]+", " ", cue), service=_service_before(text, start))


_ID_WORDS_RE = re.compile(r"(?i)(?:session|\bids?\b|[a-z]Id\b|uuid|guid|request|trace|run\b|ID)")
# A label that makes the value after it an identifier: "Request ID: PvMw_VjB...", "trace_id=...".
_ID_LABEL_RE = re.compile(
    r"(?i)\b(?:request|trace|span|correlation|message|msg|event|run|job|build|transaction|order|invoice|chat|"
    r"channel|guild|thread|discussion|commit|device|node|container|image|object|file|item)[ _\-]?ids?\b"
    r"[\"']?[ \t]*[:=#]?[ \t]*[\"'`(]?$|(?:^|[^A-Za-z_\-])id[\"']?[ \t]*[:=][ \t]*[\"'`]?$|"
    r"(?-i:[a-z]Id)[\"']?[ \t]*[:=][ \t]*[\"'`]?$"  # camel case: `voiceId: "…"`, `speakerVoiceId: "…"`
)
# `key`, `API key`, `token`, `secret` right before a value, but not after a word that makes it no credential
# ("primary key 550e8400-…", "public key 04a1…", "idempotency key …")
_NOT_CREDENTIAL_KEY_WORDS = (
    "primary", "foreign", "partition", "sort", "row", "cache", "object", "public", "idempotency", "composite",
    "unique", "lookup", "hash", "map", "index", "routing",
)
_SPACED_CUE_RE = re.compile(
    "(?i)" + "".join(f"(?<!{word} )" for word in _NOT_CREDENTIAL_KEY_WORDS)
    + r"(?<![A-Za-z0-9_\-])(?:api[ _\-]?)?(?:key|token|secret)[ \t]+$"
)
_NAMED_KEY_RE = re.compile(r"[A-Za-z0-9_\-+/.~][A-Za-z0-9_\-+/=.~]{11,1023}|[a-f0-9]{8}:[a-f0-9]{8}")
_ASSIGNED_PREFIX_RE = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?=[A-Za-z0-9])")
# Services whose 40-hex strings are mostly commit ids, and words that say a hex string is a digest
_CODE_HOSTS = frozenset({"GitHub", "GitLab", "Bitbucket", "Hugging Face"})
_DIGEST_WORDS_RE = re.compile(
    r"(?i)\b(?:commit|sha\d*|hash|digest|checksum|revision|rev|md5|etag|snapshots?|objectid|oid)\b"
)
_DOMAIN_RE = re.compile(r"(?:[A-Za-z0-9\-]+\.)+[A-Za-z]{2,6}(?:/.*)?")
_DOTTED_IDENT_RE = re.compile(r"[A-Za-z_][\w\-]*(?:\.[A-Za-z_][\w\-]*)+")
_PIECE_SPLIT_RE = re.compile(r"[-_.~/+=]")
_DUNDER_RE = re.compile(r"__[A-Za-z]\w*__")
_OWNER_RE = re.compile(r"[A-Za-z][A-Za-z0-9_\-]{2,38}")


def _random_enough(value: str, *, relaxed: bool = False) -> bool:
    """Looks machine-generated: letters and digits mixed, high entropy, no word pieces. `relaxed`
    when a cue says it is a key ("... as the token"): a hex or short value then passes too."""
    n = len(value)
    if relaxed:
        return not _is_wordish(value) and _has_letter_and_digit(value) and shannon_entropy(value) >= 3.0
    if _is_wordish(value) or _UUID_RE.fullmatch(value) or _DATE_RE.search(value) or _ascending_run(value, 8):
        return False
    digits = sum(c.isdigit() for c in value)
    letters = sum(c.isascii() and c.isalpha() for c in value)
    if digits < 2 or letters < 4:
        return False
    return shannon_entropy(value) >= (3.2 if n < 16 else 3.3 if n < 24 else 3.6)


def _random_letters(value: str) -> bool:
    """A key drawn from letters alone (`b_ByDfulghxvvmHbArJSFfQhxemJPQ...`): long, both cases mixed all
    through (a CamelCase name has an upper-case letter per word), high entropy, no word in it."""
    letters = [c for c in value if c.isascii() and c.isalpha()]
    if len(value) < 20 or len(letters) < 0.8 * len(value):
        return False
    upper = sum(c.isupper() for c in letters) / len(letters)
    return 0.25 <= upper <= 0.75 and shannon_entropy(value) >= 4.0 and not _is_wordish(value)


def _service_on_line(text: str, start: int, end: int, window: int = 100) -> str | None:
    """A known provider named on the same line as [start, end), before or after it."""
    lo = text.rfind("\n", max(0, start - window), start) + 1 or max(0, start - window)
    hi = text.find("\n", end, end + window)
    hi = hi if hi >= 0 else min(len(text), end + window)
    line = text[lo:start] + " " + text[end:hi]
    return _known_service_near(line, len(line), window=len(line))


def _in_url_or_id(text: str, start: int) -> bool:
    """The value is a URL's fragment or id parameter, or follows an identifier label ("Request ID:")."""
    line_start = max(text.rfind("\n", 0, start), text.rfind(" ", 0, start), text.rfind("\t", 0, start)) + 1
    word = text[line_start:start]
    if "://" in word and ("?" in word or "#" in word):
        return True  # a query value or fragment (`watch?v=...`, `#discussion_r...`); named secrets have their rule
    return _ID_LABEL_RE.search(text, max(0, start - 40), start) is not None


# What a long number beside a provider's name usually is, when it is not a client id or key
_NUMBER_WORDS_RE = re.compile(
    r"(?i)\b(?:id|ids|user|users|channel|guild|server|chat|group|message|msg|thread|order|invoice|phone|tel|"
    r"account|acct|number|no|nr|ticket|issue|pr|build|run|job|tx|transaction|timestamp|ts|epoch|card|iban|"
    r"tracking|sku|isbn|serial)\b"
)


def _numeric_client_id(value: str, text: str, start: int, end: int) -> bool:
    """A 15-20 digit number beside a provider's name and nothing that makes it a plain id (Asana and
    Discord client ids are such numbers; a channel or user id, an order or phone number is not a credential)."""
    if not 15 <= len(value) <= 20 or len(set(value)) < 6 or _ascending_run(value, 6) or _ascending_run(value[::-1], 6):
        return False  # (`123456789012345678`, `987654321098765432`: the docs' example ids)
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    line = text[line_start : line_end if line_end >= 0 else len(text)]
    if text[max(0, start - 1) : start] in ("#", "+", "$", ".", ",") or text[end : end + 1] in (".", ","):
        return False  # `#1234...`, `+8613...`, amounts and decimals
    return _NUMBER_WORDS_RE.search(line) is None


def _worded(value: str) -> bool:
    """A name built around words with a short random part (`pool-ab12cd34ef56`, `recent-models-64f9a55b...`):
    an id or a slug. A key's random part is long."""
    pieces = [p for p in _PIECE_SPLIT_RE.split(value) if p]
    if len(pieces) < 2:
        return False
    words = [p for p in pieces if _word_piece(p)]
    if not words:
        return False
    # how much of it is words: a slug is mostly words, a random key only has a short word-like piece
    # here and there (`ewezd` in a 90-character token)
    coverage = sum(len(p.rstrip("0123456789")) for p in words) / len(value)
    rest = max((len(p) for p in pieces if p not in words), default=0)
    return coverage >= 0.3 or (rest < 16 and len(pieces) <= 3)


def _word_piece(piece: str, min_len: int = 3) -> bool:
    """`recent`, `flake8`, `pep420`, `aarch64`: letters that read as a word, maybe a number after them."""
    letters = piece.rstrip("0123456789")
    return len(letters) >= min_len and letters.isalpha() and _is_wordish(letters)


# A release tag: `v2026.5.30-beta.1`, `2026.4.1-beta.1`, `v2026.3.N-beta.1`
_RELEASE_RE = re.compile(r"v?\d+(?:\.[0-9A-Za-z]{1,8}){1,3}(?:[-+][0-9A-Za-z.]+)?")
_HUMP_RE = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
_CAMEL_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:\.[A-Za-z][A-Za-z0-9]*)*")
_WORD_HUMP_RE = re.compile(r"[A-Z]?[a-z]{2,}")


def _camel_identifier(value: str) -> bool:
    """`allowRfc2544BenchmarkRange`, `renderQrPngBase64`, `tools.web.fetch.ssrfPolicy`: a code name in camel
    case. Nearly all its letters sit in word-shaped humps (`allow`, `Benchmark`: a capital, then lower case),
    most of them pronounceable; a random key's humps are short and its case switches anywhere."""
    if not value[0].islower() or not _CAMEL_NAME_RE.fullmatch(value):
        return False
    humps = [h for part in value.split(".") for h in _HUMP_RE.findall(part) if h.isalpha()]
    worded = [h for h in humps if _WORD_HUMP_RE.fullmatch(h)]
    spoken = [h for h in worded if len(h) >= 4 and _is_wordish(h.lower())]
    covered = sum(map(len, worded))
    return (len(worded) >= 3 and len(spoken) >= 2 and covered >= 0.8 * sum(map(len, humps))
            and sum(h[0].isupper() for h in worded) >= 2  # camel case: words start upper case inside
            and covered >= 4.5 * len(worded))  # words run long; random lower-case runs are two or three


def _short_pieces_name(value: str) -> bool:
    """`blacksmith-32vcpu-ubuntu-2404`, `audio-24khz-48kbitrate-mono-mp3`: a name of short pieces with a word
    among them. A provider's key has a long random run (or is hex, checked before)."""
    pieces = [p for p in _PIECE_SPLIT_RE.split(value) if p]
    return (len(pieces) >= 3 and max(map(len, pieces)) < 12
            and any(len(p) >= 5 and p.isalpha() and _is_wordish(p.lower()) for p in pieces))


def _slug(value: str) -> bool:
    """`TheBloke/recent-models-64f9a55b...`, `owner/repo-name`: a path of words with an id in it."""
    if "/" not in value:
        return False
    if _worded(value) or sum(1 for p in _PIECE_SPLIT_RE.split(value) if _word_piece(p, 5)) >= 2:
        return True  # (`models--t5-base/snapshots/<hex>`: two words make it a path)
    owner, _, name = value.partition("/")
    return bool(
        _OWNER_RE.fullmatch(owner) and "/" not in name and any(_word_piece(p, 5) for p in re.split(r"[-_.]", name))
    )


# Public material and identifiers a random-looking token can be: subresource integrity digests, SSH public
# keys, bodies of certificates and public keys, data: URIs, a `PublicKey =` setting (WireGuard), Stripe object
# ids (`cus_`, `in_`, `price_`: secrets are `sk_`/`rk_`/`whsec_`), OpenAI organisation ids, a Twilio account SID.
_PUBLIC_VALUE_RE = re.compile(
    r"sha(?:1|256|384|512)-[A-Za-z0-9+/=]+|org-[A-Za-z0-9]{20,}|AC[0-9a-f]{32}|"
    r"(?:cus|in|ii|il|price|prod|sub|si|pi|py|ch|re|evt|acct|cs|pm|seti|src|txn|tr|po|card|ba|plink|inv|prv)"
    r"_[A-Za-z0-9]{8,}"
)
_PUBLIC_BEFORE_RE = re.compile(
    r"(?:base64,|(?:ssh-(?:rsa|dss|ed25519)|ecdsa-sha2-nistp\d+|sk-ssh-ed25519@openssh\.com)[ \t]+|"
    r"(?i:public[\w.-]*)[ \t]*[:=][ \t]*[\"']?)$"
)
_PEM_BEGIN_RE = re.compile(r"-----BEGIN ([A-Z0-9 ]{3,40})-----")


def _public_material(text: str, start: int, end: int) -> bool:
    value = text[start:end]
    if _PUBLIC_VALUE_RE.fullmatch(value) or _PUBLIC_BEFORE_RE.search(text, max(0, start - 60), start):
        return True
    begin = text.rfind("-----BEGIN ", max(0, start - 20000), start)
    if begin < 0 or "-----END " in text[begin:start]:
        return False
    label = _PEM_BEGIN_RE.match(text, begin)
    return label is not None and ("CERTIFICATE" in label.group(1) or "PUBLIC KEY" in label.group(1))


def _extract_bare_token(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    start, end = m.span("value")
    while end > start and text[end - 1] == ".":
        end -= 1
    if _public_material(text, start, end):
        return None
    assigned = _ASSIGNED_PREFIX_RE.match(text, start, end)
    if assigned is not None and (assigned.group("name").isupper() or is_secret_name(assigned.group("name"))):
        start = assigned.end()  # `DOPPLER_TOKEN=dp.st...`: the name is no part of the key
    value = text[start:end]
    n = len(value)
    if n < 12 or "..." in value or "//" in value or _DUNDER_RE.search(value) or value.startswith("eyJ"):
        return None  # a JWT header alone (`eyJhbGciOi...`) is no credential; whole JWTs have their rule
    if _RELEASE_RE.fullmatch(value) or _camel_identifier(value.lstrip(".")):
        return None  # `v2026.5.30-beta.1`; `allowRfc2544BenchmarkRange`, `qr.renderQrPngBase64`: code
    if value[0] in "-_" and (n < 20 or not any(c.isdigit() for c in value)):
        return None  # `--no-verify`, `_private_name`: flags and identifiers
    if text.startswith(("...", "…"), end):
        return None  # elided: "sk-abc123...", shown as an example
    if _DOMAIN_RE.fullmatch(value) or _PATH_RE.fullmatch(value):
        return None
    if _DOTTED_IDENT_RE.fullmatch(value) and not any(len(p) >= 16 and _random_enough(p) for p in value.split(".")):
        return None  # `os.path.join`, `config.api_v2`; a vault `b.<random>` token has a random part
    if _in_url_or_id(text, start):
        return None
    named = _NAMED_KEY_RE.fullmatch(value) is not None and (any(c.isdigit() for c in value) or _random_letters(value))
    service = _service_on_line(text, start, end) if named else None
    # "API key 3f9a...", "token 8c1e...": the cue word right before it, only a space between, says as much
    # (not beside a digest word: "sha256 key 3f9a..." is a hash)
    cued = (
        service is None
        and named
        and _SPACED_CUE_RE.search(text, max(0, start - 24), start) is not None
        and _DIGEST_WORDS_RE.search(text, max(0, start - 100), min(len(text), end + 100)) is None
    )
    if service is not None or cued:
        # "the bot needs 7efba1e5...9cd to talk to Adobe": a provider named beside it
        hexish = all(c in "0123456789abcdef-:" for c in value.lower())
        uuid = _UUID_RE.fullmatch(value) is not None
        around = (max(0, start - 100), min(len(text), end + 100))
        if uuid and (_ID_WORDS_RE.search(text, *around) or text.endswith("#", 0, start)):
            return None  # "sessionId is 18bd4fa6-...", "openclaw-agent.sqlite#18bd4fa6-...": an identifier
        pair = ":" in value  # Sidekiq's `<hex8>:<hex8>` credentials
        # a hex string next to a code host or a digest word is a commit id or a hash, elsewhere a key
        # (24 hex beside MongoDB is an ObjectId)
        digest = _DIGEST_WORDS_RE.search(text, *around) is not None
        commit = n == 40 and service in _CODE_HOSTS
        hex_key = n >= 24 and not digest and not commit and not (n == 24 and service == "MongoDB")
        if (hexish and (n in (32, 48, 64) or uuid or pair or hex_key)) or (
            not hexish and not pair and not _worded(value) and not _slug(value) and not _short_pieces_name(value)
            and (_random_enough(value) or _random_letters(value))
        ):
            return _Hit(start, end, service=service)
        if value.isdigit() and _numeric_client_id(value, text, start, end):
            return _Hit(start, end, service=service)
    if n < 20 or ":" in value:
        return None
    if all(c in "0123456789abcdefABCDEF" for c in value):
        return None  # hashes and commit ids: a bare hex string says nothing
    classes = _char_classes(value.replace("-", "").replace("_", "").replace(".", ""))
    lower = any(c.islower() for c in value)
    upper = any(c.isupper() for c in value)
    if classes < 3 and not (n >= 24 and classes >= 2):
        return None
    if not (lower and upper):
        digits = sum(c.isdigit() for c in value)
        if not 0.15 <= digits / n <= 0.6:
            return None  # one-case letters and digits: random only with digits mixed in evenly
    entropy = shannon_entropy(value)
    # one case and digits is a 36-symbol alphabet: n draws from it reach a lower entropy than from 62
    # (32 random lowercase-and-digit characters average about 4.3 bits, half fall below it);
    # (not a path: `owner/name-2023-<hex>` slugs are one case too)
    one_case = not (lower and upper) and "/" not in value
    if entropy < ((3.9 if n < 28 else 4.05) if one_case else (4.0 if n < 28 else 4.3)):
        return None
    # every piece between separators must itself look random: "my-long-file_name-v2" does not; a long
    # value cut into short pieces counts if none of them is a word
    pieces = [p for p in _PIECE_SPLIT_RE.split(value) if p]
    if max(len(p) for p in pieces) < 16 and (
        n < 32 or any(len(p) >= 3 and p.isalpha() and _is_wordish(p) for p in pieces)
    ):
        return None
    if _is_wordish(value) or _slug(value) or not _random_enough(value):
        return None
    return _Hit(start, end, service=_known_service_near(text, start))


# A generated password pasted with no name or cue (`LK@au9j*xb*rDrV!k6ngDh7Kem90`): one run of printable
# characters between spaces (or CJK text) mixing lower and upper case, digits and punctuation that
# no identifier, path, URL, address, hash or expression is written with.
_BARE_PASSWORD_RE = (
    r"(?:(?<=[\s`(（：，])|^)(?P<value>[!-~]{10,128})(?=[\s`)）。，]|$)"
)
_PRICE_OR_ENTITY_RE = re.compile(r"^[$€£¥]\d|&(?:[a-z]{2,8}|#\d{2,5});")
_RARE_MARKS_RE = re.compile(r"[!\"#$%&'()*,;<>?@\[\\\]^`{|}~]")
_ADDRESS_RE = re.compile(r"[\w.+\-]+@[A-Za-z0-9\-]+(?:(?:\.[A-Za-z0-9\-]+)+(?:[:/]|$)|:)")
_IDENT_TOKEN_RE = re.compile(r"[A-Za-z_$][\w$]*(?:\.[A-Za-z_$][\w$]*)*")
_CALL_NAME_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_.]{2,})\(")
_CODE_PIECE_RE = re.compile(r"(?:^|[^A-Za-z0-9])[a-z_][a-z0-9_]+=|\{[A-Za-z_]")
_NAMED_SETTING_RE = re.compile(r"^-{0,2}[A-Za-z_][A-Za-z0-9_.\-]{2,}[=:]")


def _extract_bare_password(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    start, end = m.span("value")
    value = text[start:end]
    body = value.rstrip(".,;:!?")
    core = body.rstrip(")]}>")
    if _IDENT_TOKEN_RE.fullmatch(core.lstrip("([{<")):
        return None  # `N.Uint8Flags)`, `[nodes.ARG_STAR2]`: an identifier in brackets
    if not core or (core[-1] in "\"'`" and core.count(core[-1]) == 1) or _slug(core):
        return None  # the end of a quoted string that began before a space: `"hf download org/Model-1B",`
    if len(body) < 10 or not _RARE_MARKS_RE.search(body):
        return None  # base64, ids and slugs (`+/=_-.` only) are the bare-token rule's to judge
    if "://" in body or _ADDRESS_RE.match(body) or _NAMED_SETTING_RE.match(body) or _in_url_or_id(text, start):
        return None  # URLs, e-mail addresses and `user@host:` prompts, `--flag=value` / `key=value`
    if body.count("/") >= 2 or body.count("\\") >= 2 or body.startswith(("*", "#", "~", "&", "(", "\"", "'", "`")):
        return None  # paths, markdown emphasis and headings, quoted strings (a negation fails below)
    if _PRICE_OR_ENTITY_RE.search(body):
        return None  # `$0.30/MTok`, `5&nbsp;MiB`: a price, an HTML entity
    call = _CALL_NAME_RE.search(body)
    if call and (_is_wordish(call.group(1)) or "_" in call.group(1) or "." in call.group(1)):
        return None  # `Element(score=...`, `os.path.join(`: a call
    if _CODE_PIECE_RE.search(body) or any(body.count(q) >= 2 for q in "\"'`"):
        return None  # `Element(score=0.49`, `f"{x}-{y}"`: a call, a keyword argument, quoted strings
    digits = sum(c.isdigit() for c in body)
    lower = sum(c.islower() for c in body)
    upper = sum(c.isupper() for c in body)
    if min(lower, upper) < 2:
        return None
    if not digits:
        # generators leave digits out as often as not (`iCNGKxzqSPObw&$l%@T^w`): then longer, with
        # more marks and the case switching inside runs of letters as no word or name does
        marks = len(_RARE_MARKS_RE.findall(body))
        if len(body) < 16 or marks < (2 if len(body) >= 20 else 3) or _case_switches(body) < 3 or not _random_printable(
            body, min_classes=3
        ):
            return None
    elif not _random_printable(body, min_classes=4):
        return None
    # a generated value when the trailing punctuation reads as its own (a random `.` or `!` at the end)
    # trailing punctuation goes with a value that is random with it (hiding a full stop costs nothing)
    keep = value if value != body and _random_printable(value, min_classes=4) else body
    return _Hit(start, start + len(keep), service=_service_on_line(text, start, start + len(keep)))


# A password named and then given without `is` or a colon: "log in with password sunshine42", "the creds
# are admin / Qwerty2024", "login: admin / sunshine42". Prose says "password manager", "password reset",
# "admin / settings", so the value must mix letters with digits or marks (or be random), as no word does.
_PASSWORD_WORD_RE = (
    r"(?i)(?<![A-Za-z0-9_\-])(?:(?P<cue>password|passwd|passphrase|pwd|pw)[ \t]+|"
    r"(?P<cjk>密码|密碼|口令|パスワード|パスコード|暗証番号|비밀번호|패스워드|암호)[をはがも는은가이를도]?[ \t\u3000]*)"
    r"(?P<value>[!-~]{6,128})"
)
_LOGIN_PAIR_RE = (
    r"(?i)(?<![A-Za-z0-9_\-])(?P<cue>login|log[ \t]+in|logon|sign[ \t]+in|creds?|credentials)(?![A-Za-z0-9_\-])"
    r"(?:[ \t]+(?:is|are|as|with))?[ \t]*[:=]?[ \t]*(?P<user>[A-Za-z0-9._@+\-]{1,64})[ \t]*/[ \t]*"
    r"(?P<value>[!-~]{6,128})"
)


_JOINED_PARTS_RE = re.compile(r"[-_.]")


def _extract_password_word(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    start, end = _trim(text, *m.span("value"))
    value = text[start:end]
    if not value or value[0] in "\"'`([{<" or _REFERENCE_RE.search(value) or _is_placeholder(value):
        return None  # a quoted value is the cue rules'; a reference or placeholder is no password
    if len(parts := _JOINED_PARTS_RE.split(value)) > 1 and all(len(p) <= 3 or _is_wordish(p) for p in parts):
        return None  # `2fa-enabled`, `invoices-2024`: words and numbers joined, a name
    mixed = _has_letter_and_digit(value) or (_char_classes(value) >= 3 and not _is_wordish(value))
    digits = value.isdigit() and not _DATE_RE.fullmatch(value) and len(set(value)) > 1  # `密码 135790`
    if not (mixed and _plausible(value, "password")) and not _random_printable(value) and not digits:
        return None
    if "/" in value or value.lower().startswith(("http", "www.")):
        return None  # a path or an address goes on after the pair's slash
    # (the start of the match: `cue` is unset where a CJK cue matched, and -1 would read the value itself)
    service = _service_before(text, m.start())
    key_name = m.group("user") if "user" in m.groupdict() else (m.group("cue") or m.group("cjk")).lower()
    return _Hit(start, end, key_name=key_name, service=service)


# Credentials in the shapes of particular tools and formats, each found by its own syntax: `IDENTIFIED BY
# '...'` (SQL), `requirepass` (Redis), wpa_supplicant's `psk="..."`, a Wi-Fi QR code's `P:...;`, a command's
# password (`echo X | sudo -S`, `--password-stdin`, `chpasswd`, `sqlplus user/X@db`, PowerShell's
# `ConvertTo-SecureString "X" -AsPlainText`, httpie's `-a user:X`, `smbclient -U user%X`, `lftp -u user,X`,
# `7z -p'X'`), a token as a URL's user (`https://<token>@github.com`), `user:X@host` without a scheme,
# a Google app password (16 letters, in fours), a BitLocker recovery key, a spaced TOTP setup key.
# Each shape is its own small regex behind its own keywords: one alternation of all of them ran on almost every
# message (its keywords included `-` and `@`) and cost more than any other rule.
_TOOL_CREDENTIAL_SHAPES: tuple[tuple[str, str, tuple[str, ...]], ...] = (  # (rule name, regex, keywords)
    ("sql_password",
     r"(?i:\bidentified[ \t]+by(?:[ \t]+password)?|\b(?:alter|create)[ \t]+(?:user|role|login)\b[^\n;]{0,200}?"
     r"\bpassword(?:[ \t]*=)?)[ \t]*'(?P<sql>[^'\n]{1,256})'", ("identified", "password")),
    ("redis_password",
     r"(?i:\b(?:requirepass|masterauth))[ \t]+(?P<rq>[\"']?)(?P<redis>[^\s\"']{1,256})(?P=rq)",
     ("requirepass", "masterauth")),
    ("wifi_psk",
     r"(?i:\b(?:psk|wpa_passphrase|sae_password))[ \t]*=[ \t]*(?P<wq>\"?)(?P<wifi>[^\s\"]{1,128})(?P=wq)",
     ("psk", "wpa_passphrase", "sae_password")),
    ("wifi_qr_password",
     r"\bWIFI:(?:[^;\n]*;){0,6}?P:(?P<qr>(?:\\.|[^;\\\n]){1,128});", ("wifi:",)),
    ("stdin_password",
     r"\becho[ \t]+(?P<eq>[\"']?)(?P<echo>[^\s\"'|]{1,256})(?P=eq)[ \t]*\|[ \t]*"
     r"(?:sudo\b[^\n|]{0,40}?[ \t]-S\b|[^\n|]{0,120}?--password-stdin\b)", ("echo",)),
    ("chpasswd_password",
     r"\becho[ \t]+(?P<cq>[\"']?)[\w.\-]{1,64}:(?P<chpasswd>[^\s\"'|]{1,256})(?P=cq)[ \t]*\|[ \t]*"
     r"(?:sudo[ \t]+)?chpasswd\b", ("chpasswd",)),
    ("sqlplus_password",
     r"\bsqlplus(?:64)?\b[ \t]+(?:-\w+[ \t]+)*[\w$#]{1,64}/(?P<sqlplus>[^\s@/\"']{1,128})(?=@|\s|$)", ("sqlplus",)),
    ("securestring_password",
     r"(?i:ConvertTo-SecureString)[ \t]+(?:-String[ \t]+)?(?P<pq>[\"'])(?P<ps>[^\"'\n]{1,256})(?P=pq)"
     r"[ \t]+-AsPlainText", ("securestring",)),
    ("httpie_password",
     r"\bhttps?(?:[ \t][^\n]{0,120}?)?[ \t](?:-a|--auth)(?:=|[ \t]+)(?P<hq>[\"']?)[^\s:\"']{1,128}:"
     r"(?P<httpie>[^\s\"']{1,256})(?P=hq)", ("-a", "--auth")),
    ("smbclient_password",
     r"\bsmbclient\b[^\n]{0,200}?[ \t]-U[ \t]*(?P<sbq>[\"']?)[^\s%\"']{1,128}%(?P<smb>[^\s\"']{1,256})(?P=sbq)",
     ("smbclient",)),
    ("lftp_password",
     r"\blftp\b[^\n]{0,200}?[ \t]-u[ \t]*(?P<lq>[\"']?)[^\s,\"']{1,128},(?P<lftp>[^\s\"']{1,256})(?P=lq)", ("lftp",)),
    ("sevenzip_password",
     r"\b7z[a-z]?\b[^\n]{0,200}?[ \t]-p(?P<zq>[\"'])(?P<sevenzip>[^\"'\n]{1,256})(?P=zq)", ("7z",)),
    ("url_user_token",
     r"\bhttps?://(?P<urltoken>[A-Za-z0-9_\-]{12,256})@[A-Za-z0-9.\-]+", ("@",)),
    ("host_password",
     r"(?<![\w/:.@\-])[A-Za-z0-9._\-]{1,64}:(?P<hostpass>[^\s@:/\"'`]{4,128})@(?=\d{1,3}(?:\.\d{1,3}){3}\b)", ("@",)),
    ("ssh_host_password",
     r"\b(?:ssh|scp|sftp|rsync|ftp|telnet)[ \t][^\n]{0,200}?(?<![\w/:.@\-])[A-Za-z0-9._\-]{1,64}:"
     r"(?P<sshpass>[^\s@:/\"'`]{4,128})@", ("@",)),
    ("app_password",
     r"(?i:\bapp[ \-]?(?:specific[ \-])?passwords?\b|应用专用密码)[^\n]{0,30}?"
     r"(?P<apppass>(?<![a-z])[a-z]{4}(?: [a-z]{4}){3}(?![a-z])|(?<![a-z])[a-z]{16}(?![a-z]))",
     ("password", "应用专用密码")),
    ("bitlocker_recovery_key",
     r"(?<!\d)(?P<bitlocker>\d{6}(?:-\d{6}){7})(?!\d)", ("-",)),
    ("totp_setup_key",
     r"(?i:\b(?:setup|secret|2fa|totp|mfa|otp|authenticator)[ \t]+(?:key|code|seed|secret))[ \t]*[:：]?[ \t]*"
     r"(?P<totp>(?i:[a-z2-7]{4}(?:[ \t][a-z2-7]{4}){3,9}))(?![a-z2-7])",
     ("setup", "secret", "2fa", "totp", "mfa", "otp", "authenticator")),
)
_TOOL_KEY_NAMES = {
    "sql": "IDENTIFIED BY", "redis": "requirepass", "wifi": "psk", "qr": "WIFI P", "echo": "sudo -S / --password-stdin",
    "chpasswd": "chpasswd", "sqlplus": "sqlplus", "ps": "ConvertTo-SecureString", "httpie": "http -a",
    "smb": "smbclient -U", "lftp": "lftp -u", "sevenzip": "7z -p", "urltoken": "URL token",
    "hostpass": "user:password@host", "sshpass": "user:password@host",
    "apppass": "app password", "bitlocker": "BitLocker recovery key", "totp": "TOTP secret",
}


def _extract_tool_credential(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    found = m.groupdict()
    group = next(g for g in _TOOL_KEY_NAMES if found.get(g) is not None)
    start, end = m.span(group)
    value = text[start:end]
    if len(value) < 3 or _is_placeholder(value) or _REFERENCE_RE.search(value) or value.startswith("$"):
        return None
    if group == "urltoken" and not (_random_printable(value) or _plausible(value, "token")):
        return None  # `https://build-server-artifacts@…` is a name
    if group in ("hostpass", "sshpass") and not _has_letter_and_digit(value):
        return None  # `mailto:alice@example.com`
    if group == "totp" and len(value.replace(" ", "").replace("\t", "")) < 16:
        return None
    return _Hit(start, end, key_name=_TOOL_KEY_NAMES[group], service=_known_service_near(text, m.start()))


# A markdown table with a password (or secret) column: each row's cell in it (`| db1 | root | Rt7#mVq92 |`). One
# match is the whole table (header, separator, its rows), so finding each row's header costs nothing.
_TABLE_RE = (
    r"(?m)^(?P<header>[ \t]*\|[^\n]*)\n"
    r"[ \t]*\|?[ \t]*:?-{3,}:?[ \t]*(?:\|[ \t]*:?-{3,}:?[ \t]*)*\|?[ \t]*\r?\n"  # the separator line
    r"(?P<rows>(?:[ \t]*\|[^\n]*(?:\n|$))+)"
)
_TABLE_ROW_RE = re.compile(r"[ \t]*\|(?P<row>[^\n]{3,2000})\|[ \t]*\r?")
_SECRET_COLUMN_RE = re.compile(r"(?i)^\W*(?:password|passwd|pass|pwd|pw|secret|密码|密碼|パスワード)\W*$")


def _cells(row: str) -> list[tuple[int, int]]:
    """(start, end) of each cell's stripped text within `row` (the text between the outer pipes)."""
    spans, at = [], 0
    for cell in row.split("|"):
        lead = len(cell) - len(cell.lstrip())
        spans.append((at + lead, at + len(cell.rstrip())))
        at += len(cell) + 1
    return spans


def _extract_table_cells(rule: Rule, m: re.Match[str], text: str) -> list[_Hit] | None:
    header = m.group("header").strip()
    if header.startswith("|-"):
        return None
    names = [c.strip() for c in header.strip("|").split("|")]
    column = next((i for i, name in enumerate(names) if _SECRET_COLUMN_RE.match(name)), None)
    if column is None:
        return None
    hits = []
    at = m.start("rows")
    for line in m.group("rows").split("\n"):
        row = _TABLE_ROW_RE.fullmatch(line)
        if row is not None and (hit := _table_cell(text, at + row.start("row"), row.group("row"), names, column)):
            hits.append(hit)
        at += len(line) + 1
    return hits


def _table_cell(text: str, row_start: int, row: str, names: list[str], column: int) -> _Hit | None:
    """The password column's cell of one row, where it holds a credential."""
    cells = _cells(row)
    if column >= len(cells) or len(cells) != len(names):
        return None
    a, b = cells[column]
    start, end = row_start + a, row_start + b
    value = text[start:end].strip("`")
    start = text.find(value, start, end)
    if len(value) < 4 or _is_placeholder(value) or _REFERENCE_RE.search(value) or " " in value or value[0] in "-$":
        return None
    if not (_has_letter_and_digit(value) or _plausible(value, "password") or _random_printable(value)):
        return None  # `| prod | admin | (in the vault) |`, `| see below |`
    return _Hit(start, start + len(value), key_name=names[column], service=_service_on_line(text, start, end))


# A JWT whose header is all that proves it (`eyJhbGciOi…` then one or more segments): unsigned (`alg: none`, no
# signature), its payload not JSON (an opaque body some vendors sign), or its segments glued by issuers'
# own dots. The header must decode to a JSON object naming `alg` or `typ`: no other base64 starts that way.
_JWT_HEADER_LED_RE = _L + r"eyJ[A-Za-z0-9_\-]{10,}={0,2}(?:\.[A-Za-z0-9_\-+/]{8,}={0,2}){1,4}" + _R


def _extract_jwt_header_led(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    header = m.group().split(".", 1)[0].rstrip("=")
    try:
        decoded = json.loads(base64.urlsafe_b64decode(header + "=" * (-len(header) % 4)))
    except (binascii.Error, ValueError):
        return None
    if not isinstance(decoded, dict) or not ({"alg", "typ"} & decoded.keys()):
        return None
    return _Hit(m.start(), m.end(), service="JWT", key_name="JWT")


# A webhook URL whose path carries its token after a `webhook(s)`/`hooks` segment (Teams' older and newer
# forms, Mattermost, Rocket.Chat, Google Chat, Zapier, a CI's incoming hook): whoever holds the URL can post.
# The whole URL is the credential, as for Slack's and Discord's rules; the part after the segment must hold a
# key (letters and digits mixed, 20+ of them, not words): `…/hooks/12345` or `/webhooks/getting-started` do not.
_WEBHOOK_URL_RE = (
    r"(?i)(?<![\w.\-])https?://(?P<host>[a-z0-9][a-z0-9.\-]{0,253})(?::\d{1,5})?(?:/[\w.\-~%]*){0,8}?"
    r"/(?:webhooks?|webhookb2|hooks|incomingwebhook)/(?P<rest>[A-Za-z0-9_\-/@.=%~]{16,1024})"
)
_WEBHOOK_KEY_PIECE_RE = re.compile(r"[A-Za-z0-9]+")


def _extract_webhook_url(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    rest = m.group("rest").rstrip(".,;:/")
    body = "".join(_WEBHOOK_KEY_PIECE_RE.findall(rest))
    if len(body) < 20 or not _has_letter_and_digit(body) or shannon_entropy(body) < 3.0:
        return None
    if all(_is_wordish(p) or p.isdigit() for p in _WEBHOOK_KEY_PIECE_RE.findall(rest)):
        return None  # `/hooks/github/events/2024`: words and numbers, a route
    if _is_placeholder(rest) or _REFERENCE_RE.search(rest):
        return None
    end = m.start("rest") + len(rest)
    return _Hit(m.start(), end, key_name="WEBHOOK_URL", service=_known_service_near(m["host"], len(m["host"])))


_GENERIC_RULES: tuple[Rule, ...] = (
    _g("jwt_header_led", _JWT_HEADER_LED_RE, ("eyj",), _extract_jwt_header_led, key_name="JWT"),
    _g("webhook_url", _WEBHOOK_URL_RE, ("hook",), _extract_webhook_url, key_name="WEBHOOK_URL"),
    _g(
        "env_assignment", _ASSIGNMENT_RE, ("key", "token", "secret", "pass", "pwd", "auth", "cred"), _extract_assignment
    ),
    _g("name_value_pair", _NAME_VALUE_PAIR_RE, ("value",), _extract_assignment),
    _g("xml_name_value_pair", _XML_NAME_VALUE_RE, ("<value>",), _extract_assignment),
    _g("secret_setter_call", _SETTER_CALL_RE, ("token", "secret", "pass", "pwd", "key", "cred"), _extract_assignment),
    _g("compared_literal", _COMPARED_LITERAL_RE, ("==", "!="), _extract_assignment),
    _g("env_line", _ENV_LINE_RE, ("key", "token", "secret", "pass", "pwd", "auth", "cred"), _extract_assignment),
    _g("xml_secret_element", _XML_ELEMENT_RE, ("key", "token", "secret", "pass", "pwd", "auth", "cred"),
       _extract_assignment),
    _g("xml_key_value", _XML_KEY_VALUE_RE, ("value",), _extract_assignment),
    _g("xml_secret_words", _XML_WORDS_RE, ("token>", "secret>", "password>", "passwd>", "key>"), _extract_xml_words),
    _g(
        "cli_secret_flag",
        _CLI_FLAG_RE,
        ("-api", "-token", "-access", "-auth", "-pass", "-secret", "-client", "-pat", "tlspassword", "password",
         "storepass", "keypass"),
        _extract_cli_flag,
    ),
    _g("authorization_header", _AUTH_HEADER_RE, ("authorization",), _extract_auth_header),
    _g("bearer_token", _BEARER_RE, ("bearer",), _extract_auth_header),
    _g("docker_config_auth", _DOCKER_AUTH_RE, ("auth",), _extract_basic_auth),
    _g("url_credentials", _URL_CREDENTIALS_RE, ("://",), _extract_url_credentials),
    _g("dsn_credentials", _DSN_CREDENTIALS_RE, ("@tcp(", "@unix("), _extract_url_credentials),
    _g("curl_user_password", _CURL_USER_RE, ("-u", "--user"), _extract_curl_user),
    _g("connection_string_password", _BRACED_PASSWORD_RE, ("pwd", "password"), _extract_braced_password),
    _g("netrc_password", _NETRC_RE, ("machine",), _extract_positional_password),
    _g("password_argument", _GROOVY_PASSWORD_RE, ("password", "passwd"), _extract_positional_password),
    _g(
        "command_password",
        _COMMAND_PASSWORD_RE,
        ("psexec", "sshpass", "login", "-cli", "sqlcmd", "osql", "bcp", "ldap", "mosquitto", "zip", "mongo",
         "rdesktop", "xfreerdp"),
        _extract_positional_password,
    ),
    _g("mysql_password", _MYSQL_RE, ("mysql", "mariadb"), _extract_positional_password),
    _g("credential_call", _CREDENTIAL_CALL_RE, ("credential", "auth", "directoryentry"), _extract_positional_password),
    _g(
        "password_cue",
        _PASSWORD_CUE_RE,
        ("pass", "pw", "pin", "密码", "密碼", "口令", "密匙", "通行码", "パスワード", "パスコード", "暗証番号",
         "合言葉", "비밀번호", "패스워드"),
        _extract_password_cue,
        kind="cue",
    ),
    _g(
        "token_cue",
        _TOKEN_CUE_RE,
        ("key", "token", "secret", "credential", "密钥", "秘钥", "私钥", "令牌", "授权码", "凭", "秘密鍵", "キー",
         "トークン"),
        _extract_token_cue,
        kind="cue",
    ),
    _g("table_secret_column", _TABLE_RE, ("|",), _extract_table_cells),
    *(_g(name, regex, keywords, _extract_tool_credential) for name, regex, keywords in _TOOL_CREDENTIAL_SHAPES),
    _g("password_word", _PASSWORD_WORD_RE, ("pass", "pwd", "pw", "密码", "密碼", "口令", "パスワード", "パスコード",
                                            "暗証番号", "비밀번호", "패스워드", "암호"), _extract_password_word,
       kind="cue", key_name="password"),
    _g("login_pair", _LOGIN_PAIR_RE, ("log", "sign", "cred"), _extract_password_word, kind="cue",
       key_name="password"),
    _g("label_line", _LABEL_LINE_RE, ("pass", "pwd", "key", "token", "secret"), _extract_label_line, kind="cue"),
    # listed last: where an older rule finds the same span, its name and key name are kept
    _g("trailing_cue", _TRAILING_CUE_RE, ("key", "token", "secret", "pass", "credential"), _extract_trailing_cue,
       kind="cue"),
    _g("high_entropy_token", _BARE_TOKEN_RE, (), _extract_bare_token, kind="cue", key_name="token"),
    _g("random_password", _BARE_PASSWORD_RE, (), _extract_bare_password, kind="cue", key_name="password"),
)

# Kubernetes Secret manifests: every value under `data:` (base64) or `stringData:` of a `kind: Secret`.
_K8S_KIND_RE = re.compile(r"(?i)\bkind[\"']?[ \t]*:[ \t]*[\"']?secret\b")
_K8S_DATA_RE = re.compile(r"(?m)^[ \t]*(?:data|stringData)[ \t]*:[ \t]*$")
_K8S_VALUE_RE = (
    r"(?m)^(?P<indent>[ \t]+)(?P<name>[\w.\-]{1,253})[ \t]*:[ \t]*(?:[|>][\-+]?[ \t]*\r?\n[ \t]+)?"
    r"(?P<q>[\"']?)(?P<secret>[^\s\"'#]{6,4096})(?P=q)[ \t]*\r?$"
)


def _extract_k8s_secret(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    before = text[max(0, m.start() - 4000) : m.start()]
    data = None
    for found in _K8S_DATA_RE.finditer(before):
        data = found  # the last `data:` / `stringData:` line before the value
    if data is None or not _K8S_KIND_RE.search(text, max(0, m.start() - 4000), min(len(text), m.end() + 4000)):
        return None
    # only lines inside that block: nothing between it and the value sits less indented than the value
    block = before[data.end() :]
    indent = len(m.group("indent").expandtabs())
    for line in block.splitlines():
        if line.strip() and len(line) - len(line.lstrip()) < indent:
            return None
    start, end = m.span("secret")
    value = text[start:end]
    if _is_placeholder(value) or _REFERENCE_RE.search(value):
        return None
    return _Hit(start, end, key_name=m.group("name"), service="Kubernetes")


_K8S_RULES: tuple[Rule, ...] = (
    Rule(
        name="kubernetes_secret_data",
        service="Kubernetes",
        key_name="SECRET_DATA",
        kind="context",
        pattern=re.compile(_K8S_VALUE_RE),
        keywords=("kind",),
        extract=_extract_k8s_secret,
    ),
)

# A private key's base64 body pasted without its BEGIN/END lines, one line or wrapped (newlines, literal
# `\n` / `\r\n` as in JSON, or string concatenation `"..." +`). Told apart from other base64 by what
# it decodes to: OpenSSH's `openssh-key-v1` magic, or a DER key (PKCS#1/#8/SEC1: a SEQUENCE whose
# first field is the INTEGER version 0 or 1; a certificate starts with a nested SEQUENCE instead).
_B64_LINE = r"[A-Za-z0-9+/]{16,}"
_B64_BREAK = r"(?:[ \t]*(?:\\r)?\\n[ \t]*|[ \t]*\r?\n[ \t]*|[\"'][ \t]*\+?[ \t]*\r?\n[ \t]*\+?[ \t]*[\"'])"
_KEY_BODY_RE = (
    # DER keys open `MII` (RSA, PKCS#8), `MIG` (EC P-384, PKCS#8 EC), `MHc` (EC P-256), `MC4C` (Ed25519)
    r"(?<![A-Za-z0-9+/])(?:b3BlbnNzaC1rZXktdjE|MI[IG]|MHc|MC4C)[A-Za-z0-9+/]{36,}"
    r"(?:" + _B64_BREAK + _B64_LINE + r"){0,400}={0,2}"
    # a short last line: padded, or holding a digit or `+/` (a word on the next line is prose)
    r"(?:" + _B64_BREAK + r"(?:[A-Za-z0-9+/]{1,15}={1,2}|(?=[A-Za-z]{0,14}[0-9+/])[A-Za-z0-9+/]{2,15}))?"
    # ends where base64 does: not inside a run, nor before padding left unread; `=` then text is a setting
    # glued on (`…2fEv=https://…`), not padding
    r"(?![A-Za-z0-9+/])(?!={1,2}(?![A-Za-z0-9+/]))"
)
_KEY_BREAK_RE = re.compile(_B64_BREAK)


def _extract_key_body(rule: Rule, m: re.Match[str], text: str) -> _Hit | None:
    start, end = m.span()
    body = _KEY_BREAK_RE.sub("", text[start:end])
    if len(body) < 120:
        return None  # an EC key is ~160 characters; anything shorter is no private key
    if not body.startswith("b3BlbnNzaC1rZXktdjE"):
        try:
            der = base64.b64decode(body[:16], validate=True)
        except (binascii.Error, ValueError):
            return None
        if len(der) < 8 or der[0] != 0x30:
            return None
        i = 2 + (der[1] & 0x7F if der[1] & 0x80 else 0)  # past the SEQUENCE's length
        if der[i : i + 3] not in (b"\x02\x01\x00", b"\x02\x01\x01"):
            return None
    return _Hit(start, end)


_KEY_BODY_RULES: tuple[Rule, ...] = (
    Rule(
        name="private_key_body",
        service="PEM",
        key_name="PRIVATE_KEY",
        kind="provider",
        pattern=re.compile(_KEY_BODY_RE),
        keywords=("b3blbnnzac1rzxktdje", "mii", "mig", "mhc", "mc4c"),
        extract=_extract_key_body,
    ),
)

RULES: tuple[Rule, ...] = (
    _K8S_RULES + _KEY_BODY_RULES + _PROVIDER_RULES + _MORE_PROVIDER_RULES + _CONTEXT_RULES + PERSONAL_RULES
    + _GENERIC_RULES
)
_RULE_ORDER: dict[str, int] = {rule.name: i for i, rule in enumerate(RULES)}
# Rules whose value a person typed (a cue, a command or a tool's syntax said it is a password): short, maybe a
# word, and the same where it recurs as a whole word in the message ("my password is Summer24! and when I
# type Summer24! ...": engine._with_repeats).
TYPED_PASSWORD_RULES: frozenset[str] = frozenset({
    "password_cue", "password_word", "login_pair", "command_password", "mysql_password", "password_argument",
    *(name for name, _, _ in _TOOL_CREDENTIAL_SHAPES),
})
_ALL_KEYWORDS: tuple[str, ...] = tuple(sorted({k for r in RULES for k in r.keywords}))
# The rules (indexes into RULES) each keyword wakes, and those that always run: a text wakes a handful of
# rules instead of testing every rule's keywords (an id field is redacted too, on every entry).
_RULES_OF_KEYWORD: dict[str, tuple[int, ...]] = {
    keyword: tuple(i for i, rule in enumerate(RULES) if keyword in rule.keywords) for keyword in _ALL_KEYWORDS
}
_KEYWORDLESS_RULES: tuple[int, ...] = tuple(i for i, rule in enumerate(RULES) if not rule.keywords)


