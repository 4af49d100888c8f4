"""Variable names and services: which names hold a credential, which service a key belongs to."""

from __future__ import annotations

import re

# ---------------------------------------------------------------------------------------------
# Names and services

_SERVICES: dict[str, str] = {
    "openai": "OpenAI",
    "chatgpt": "OpenAI",
    "anthropic": "Anthropic",
    "claude": "Anthropic",
    "deepseek": "DeepSeek",
    "gemini": "Gemini",
    "google": "Google",
    "gcp": "Google Cloud",
    "firebase": "Firebase",
    "youtube": "YouTube",
    "aws": "AWS",
    "amazon": "AWS",
    "azure": "Azure",
    "github": "GitHub",
    "gh": "GitHub",
    "gitlab": "GitLab",
    "slack": "Slack",
    "stripe": "Stripe",
    "telegram": "Telegram",
    "tg": "Telegram",
    "discord": "Discord",
    "huggingface": "Hugging Face",
    "hf": "Hugging Face",
    "twilio": "Twilio",
    "sendgrid": "SendGrid",
    "mailgun": "Mailgun",
    "npm": "npm",
    "pypi": "PyPI",
    "docker": "Docker Hub",
    "dockerhub": "Docker Hub",
    "digitalocean": "DigitalOcean",
    "cloudflare": "Cloudflare",
    "cf": "Cloudflare",
    "shopify": "Shopify",
    "groq": "Groq",
    "xai": "xAI",
    "grok": "xAI",
    "openrouter": "OpenRouter",
    "mistral": "Mistral",
    "replicate": "Replicate",
    "linear": "Linear",
    "notion": "Notion",
    "atlassian": "Atlassian",
    "jira": "Atlassian",
    "confluence": "Atlassian",
    "sentry": "Sentry",
    "databricks": "Databricks",
    "supabase": "Supabase",
    "vercel": "Vercel",
    "postman": "Postman",
    "square": "Square",
    "paypal": "PayPal",
    "braintree": "Braintree",
    "heroku": "Heroku",
    "alibaba": "Alibaba Cloud",
    "aliyun": "Alibaba Cloud",
    "阿里云": "Alibaba Cloud",
    "tencent": "Tencent Cloud",
    "腾讯云": "Tencent Cloud",
    "qcloud": "Tencent Cloud",
    "dashscope": "Alibaba DashScope",
    "qwen": "Alibaba DashScope",
    "通义": "Alibaba DashScope",
    "百炼": "Alibaba DashScope",
    "moonshot": "Moonshot",
    "kimi": "Moonshot",
    "siliconflow": "SiliconFlow",
    "硅基流动": "SiliconFlow",
    "zhipu": "Zhipu",
    "智谱": "Zhipu",
    "glm": "Zhipu",
    "baidu": "Baidu",
    "qianfan": "Baidu Qianfan",
    "百度": "Baidu",
    "perplexity": "Perplexity",
    "tavily": "Tavily",
    "langsmith": "LangSmith",
    "langchain": "LangSmith",
    "resend": "Resend",
    "netlify": "Netlify",
    "mapbox": "Mapbox",
    "firecrawl": "Firecrawl",
    "elevenlabs": "ElevenLabs",
    "fireworks": "Fireworks AI",
    "cohere": "Cohere",
    "together": "Together AI",
    "grafana": "Grafana",
    "newrelic": "New Relic",
    "figma": "Figma",
    "airtable": "Airtable",
    "doppler": "Doppler",
    "pulumi": "Pulumi",
    "terraform": "Terraform Cloud",
    "vault": "HashiCorp Vault",
    "hashicorp": "HashiCorp Vault",
    "mailchimp": "Mailchimp",
    "dropbox": "Dropbox",
    "line": "LINE",
    "feishu": "Feishu",
    "飞书": "Feishu",
    "lark": "Feishu",
    "dingtalk": "DingTalk",
    "钉钉": "DingTalk",
    "wechat": "WeChat",
    "微信": "WeChat",
    "openclaw": "OpenClaw",
    "postgres": "PostgreSQL",
    "postgresql": "PostgreSQL",
    "mysql": "MySQL",
    "redis": "Redis",
    "mongodb": "MongoDB",
    "mongo": "MongoDB",
    "amqp": "RabbitMQ",
    "rabbitmq": "RabbitMQ",
    "ftp": "FTP",
    "sftp": "SFTP",
    "smtp": "SMTP",
    "ssh": "SSH",
    "wifi": "Wi-Fi",
    "wi-fi": "Wi-Fi",
    "fly.io": "Fly.io",
    "flyio": "Fly.io",
    "crates.io": "crates.io",
    "microsoft teams": "Microsoft Teams",
    "ms teams": "Microsoft Teams",
}
# More providers whose keys people paste (the public scanners' rule sets name them): a key near one
# of these names needs less to be taken for a key.
_SERVICES.update(
    {
        name.lower(): _SERVICES.get(name.lower(), name)
        for name in """
        Adafruit Adobe Algolia Artifactory Asana Authress Beamer Bitbucket Bittrex Clojars ClickHouse Codecov
        Coinbase Confluent Contentful Datadog Dynatrace DroneCI Duffel EasyPost Etsy Facebook Fastly Finicity
        Finnhub Flickr Flutterwave Frameio Freemius FreshBooks GoCardless Gitter HubSpot Infracost Intercom JFrog
        KuCoin LaunchDarkly LinkedIn Looker Mailchimp MaxMind Mattermost MessageBird Meraki NYTimes Okta OpenShift
        Plaid PlanetScale Prefect RapidAPI RubyGems Scalingo SendBird Sendinblue Brevo Shippo Sidekiq Snyk SonarQube
        Sourcegraph Squarespace SumoLogic TravisCI Twitch Twitter Typeform Yandex Zendesk Auth0 Blynk CodeClimate
        Jenkins Kagi Postmark PsExec Salesforce StackHawk TeamCity ThingsBoard TrueNAS VMware WireGuard Kubernetes
        NuGet Shopify Trello Bitly Pinecone Weaviate Qdrant Cloudinary Mixpanel Amplitude Dropbox Jira Confluence
        Cisco Meraki Kraken Octopus Lob SettleMint Sonar SonarCloud 1Password Intra42 PrivateAI Jina NASA Gitalk
        SauceLabs Sauce Particle Harness DependencyTrack Bitfinex Alchemy Infura Etherscan Clerk Hasura
        Segment Pusher Render Railway Neon Upstash Convex Fauna Sanity Strapi Zapier Workato Vonage Nexmo
        Plivo Telnyx OneLogin Keycloak PagerDuty Opsgenie Rollbar Bugsnag Honeycomb Loggly Papertrail Splunk
        Elastic Scaleway Hetzner Linode Vultr Backblaze
        """.split()  # noqa: SIM905 - a word list reads better as text
    }
)
# The providers the public scanners have detectors for (the rule names of gitleaks, Nosey Parker and
# TruffleHog and, added after Kingfisher was measured, Kingfisher's; compounds such as
# `airtablepersonalaccesstoken` cut to the provider): a random key in the same line as one of these names is
# taken for its key. English words among them count only when capitalised (`_WORD_SERVICES`).
_SCANNER_PROVIDERS = """
    abuseipdb abyssale accuweather adafruitio adobeio adzuna aeroworkflow agora airbrake airship airvisual
    aiven alconost alegra aletheiaapi alienvault allsports amadeus amazonbedrock ambee anypoint apacta
    api2cart apideck apiflash apifonica apify apilayer apimatic apimetrics apitemplate apollo appcues
    appfollow appointedd appoptics appsynergy apptivo artsy assemblyai atera audd autodesk autoklose
    autopilot avaza aviationstack axonaut aylien ayrshare azureapp bannerbear baremetrics beebole besnappy
    besttime betterstack billomat bitbar bitbucketapp bitcoinaverage bitmex blazemeter blitapp blocknative
    blogger bombbomb boostnote borgbase braintreepayments braintrust brandfetch browserstack browshot
    bscscan buddyns budibase bugherd buildkite bulbul buttercms caflou calendarific calendly calorieninja
    campayn cannyio capsulecrm captaindata carboninterface cashboard caspio censys centralstationcrm cexio
    chartmogul chatfule checio checklyhq cicero circleci clarifai clearbit clickup cliengo clientary
    clinchpad clockify clockwork closecrm cloudconvert cloudelements cloudflareapi cloudflareca cloudimage
    cloudmersive cloudplan cloudsight cloudsmith cloverly cloze clustdoc coda codacy codemagic codequiry
    coinapi coinlayer coinlib collect2 column commercejs companyhub conversiontools convertapi convertkit
    convier copper couchbase countrylayer courier coveralls craftmypdf crowdin cryptocompare currencycloud
    currencyfreaks currencylayer currencyscoop currentsapi customerguru customerio d7network dailyco
    dandelion dareboost databox debounce deepai deepgram delighted demio deputy detectify detectlanguage
    dfuse diffbot diggernaut disqus ditto dnscheck docparser documo docusign dotdigital dronahq duply
    dynalist dyspatch eagleeyenetworks easyinsight ecostruxureit edamam edenai eightxeight elasticemail
    enablex endorlabs enigma envoy eraser ethplorer eventbrite everhour exchangerateapi exchangeratesapi
    exportsdk extractorapi faceplusplus fastforex feedier fetchrss fibery fileio finage
    financialmodelingprep findl fixerio flatio fleetbase flexport flightapi flightlabs flightstats flowflu
    fmfw formbucket formcraft formio formsite foursquare freshdesk fulcrum fullstory fxmarket geckoboard
    gengo geoapify geocodify geocodio geoipifi getemail getemails getgeoapi getgist getresponse getsandbox
    githubapp glassnode gocanvas godaddy goodday graphcms graphhopper groovehq gtmetrix guardianapi gumroad
    gyazo happyscribe harvest hellosign helpcrunch helpscout hereapi hiveage holidayapi holistic html2pdf
    humanity hunter hybiscus hypertrack ibmcloud iconfinder iexapis iexcloud imagekit imagga impala
    insightly instabot instamojo interseller intrinio invoiceocean ip2location ipapi ipgeolocation ipinfo
    ipinfodb ipquality ipstack jotform jumpcloud jupiterone juro kanbantool karmacrm keenio kickbox klaviyo
    klipfolio knapsackpro kontent kylas langfuse languagelayer larksuite leadfeeder lemlist lemonsqueezy
    lendflow lessannoyingcrm lexigram linearapi linemessaging linenotify linkpreview liveagent livestorm
    loadmill locationiq loginradius logzio lokalise loyverse lunchmoney luno madkudu magicbell mailboxlayer
    mailerlite mailjet mailmodo mailsac mandrill mapquest marketstack mavenlink meaningcloud mediastack
    meistertask mesibo metaapi metabase metrilo microsoftteams mindmeister miro mite mixmax mockaroo monday
    monkeylearn moonclerk moosend moralis myfreshworks myintervals nasdaqdatalink nethunt netsuite
    neutrinoapi newrelicmobileapp newsapi newscatcher nftport ngrok nicereply nightfall nimble noticeable
    nozbeteams numverify nutritionix nvapi nylas oanda octopusdeploy omnisend onepagecrm onesignal onfleet
    oopspam opencagedata openuv openvpn openweather optimizely overloop owlbot packagecloud pagarme pandadoc
    pandascore paperform paralleldots parsehub parseur partnerstack pastebin paydirtapp paymoapp paymongo
    paystack pdflayer pdfshift peopledatalabs pepipost percy pganalyze photoroom pinata pipedream pipedrive
    pivotaltracker pixabay planviewleankit planyo podio pollsapi poloniex polygon portainer positionstack
    postageapp posthog powrbot privacy prodpad prospectcrm protocolsio proxycrawl pubnub purestake
    pushbullet pusherchannel qase qualaroo qubole railwayapp ramp raven rawg razorpay reachmail
    reallysimplesystems rebrandly recaptcha rechargepayments redhatpyxis refiner rentman repairshopr replyio
    requestfinance restpack restpackhtmltopdfapi restpackscreenshotapi revampcrm ringcentral ritekit
    robinhoodcrypto rocketreach rockset rootly route4me rownd runrunit saladcloud salesblink salescookie
    salesflare salesforcerefresh salesmate satismeter scalr scrapeowl scraperapi scraperbox scrapestack
    scrapfly scrapingant scrapingbee screenshotapi screenshotlayer scrutinizerci securitytrails selectpdf
    semaphore sentryorg serphouse serpstack sheety sherpadesk shipday shodan shortcut shotstack shutterstock
    signalwire signaturit signupgenius sigopt simfin simplesat simplynoted simvoly sinchmessage sirv
    siteleaf skrappio skybiometry smartsheets smartystreets smooch snipcart snowflake solarwinds
    sourcegraphcody sparkpost spectralops speechtextai spoonacular sportsmonk spotify squareapp squareup
    sslmate statuscake statuspage statuspal stitchdata stockdata storecove stormboard stormglass storyblok
    storychief strava streak stripo stytch sugester supernotesapi surveyanyplace surveybot surveysparrow
    survicate swell swiftype tableau tailscale tallyfy tatumio taxjar teamgate teamworkcrm teamworkdesk
    teamworkspaces technicalanalysisapi tefter telegrambot teletype terraformcloud testingbot textmagic
    theoddsapi thinkific thousandeyes ticketmaster tickettailor tiingo timecamp timezoneapi tines tmetric
    todoist toggltrack tokeet tomorrowio tomtom tradier transferwise travelpayouts trufflehog twelvedata
    twist twitterconsumer tyntec typetalk ubidots uclassify unifyid unplugg unsplash upcdatabase uplead
    uploadcare uptimerobot upwave urlscan userflow userstack vagrantcloud vatlayer vbout verimail veriphone
    versioneye viewneo virustotal visualcrossing voiceflow voicegain vouchery vpnapi vyte walkscore
    weatherbit weatherstack webex webexbot webflow webscraper webscraping websitepulse weightsandbiases
    wepay whoxy wistia worksnaps workstack worldcoinindex worldweather wrike yelp youneedabudget yousign
    zendeskapi zenkitapi zenrows zenscrape zenserp zeplin zerobounce zerotier zipapi zipcodeapi zipcodebase
    zohocrm zonkafeedback zulipchat
""".split()  # noqa: SIM905 - a word list reads better as text
_SERVICES.update({name: name.capitalize() for name in _SCANNER_PROVIDERS if name not in _SERVICES})
_NOT_SERVICES = frozenset(
    """
    the my our your his her their its a an this that these those here there is was new old my own
    api app access secret private public personal auth bearer client bot user admin root default
    test prod production dev staging local main primary backup real actual same other full generated
    current previous next following above below one two key token password and or for of to with
    from in on at by it me you we they please use using set get export login username email account
    """.split()  # noqa: SIM905 - a word list reads better as text
) | frozenset(["的", "我的", "你的", "他的", "这个", "那个", "新的", "旧的", "一个", "这是", "以下", "下面"])

# Names that say only "a secret" (`key:`, `PASSWORD=`), no service or purpose.
_GENERIC_KEY_NAMES = frozenset(
    "key keys token tokens secret password passwd pass apikey api_key credential credentials auth".split()  # noqa: SIM905
)
_NAME_SPLIT_RE = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_SECRET_SEGMENTS = frozenset(
    """
    key apikey token secret password passwd pwd passphrase pass credential credentials cred creds
    auth privatekey accesskey secretkey
    """.split()  # noqa: SIM905 - a word list reads better as text
)
_SECRET_SUFFIXES = ("token", "secret", "password", "passwd", "apikey", "accesskey", "secretkey", "privatekey")
_NON_SECRET_LAST = frozenset(
    """
    chars charset alphabet path file files dir dirs url uri urls endpoint host hostname port mode type types name names
    arn enabled enable disabled env header headers prefix suffix length len ttl expiry expires
    expiration expire timeout count limit limits max min id ids format method algorithm alg provider
    providers source region version size hint label field fields kind policy scope scopes usage
    budget cost rate window index ref refs var variable location store storage backend helper
    command cmd schema regex pattern list map set required optional flag flags check checks status
    state valid rotation rotated hash hashed salt rounds iterations strength mask masked template
    encoder encoding hasher validator prompt placeholder reset
    """.split()  # noqa: SIM905 - a word list reads better as text
)
_KEY_ONLY_QUALIFIERS = frozenset(
    """
    public session cache idempotency primary foreign partition sort dedupe dedup object map dict
    lookup row group message event index unique composite routing shard cursor record entry state
    config hot short sub react item list node component table column field storage bucket s3 gpg pgp
    ssh host signing verify verification encryption kms license registry sessions channel
    """.split()  # noqa: SIM905 - a word list reads better as text
)


def _name_segments(name: str) -> list[str]:
    last = re.split(r"[.:]", name)[-1] or name
    return [s.lower() for s in _NAME_SPLIT_RE.findall(last)]


def is_secret_name(name: str) -> bool:
    """True for variable names that hold a credential: DEEPSEEK_API_KEY, apiKey, db_password."""
    segments = _name_segments(name)
    if not segments:
        return False
    if segments[-1] in _NON_SECRET_LAST or "public" in segments:
        return False
    if len(segments) == 1 and segments[0] == "pwd":
        return False  # the shell's current directory
    found = False
    for i, seg in enumerate(segments):
        if seg in _SECRET_SEGMENTS or seg.endswith(_SECRET_SUFFIXES):
            if seg == "key" and i > 0 and segments[i - 1] in _KEY_ONLY_QUALIFIERS:
                continue
            if seg in ("pass", "auth", "cred") and len(segments) == 1:
                continue  # too ambiguous alone
            found = True
    return found


def _secret_word(name: str) -> str:
    segments = _name_segments(name)
    for seg in reversed(segments):
        if seg.startswith(("pass", "pwd")) or seg.endswith(("password", "passwd")):
            return "password"
    if segments == ["key"]:
        return "key"  # a bare `key:` (YAML, JSON) is as often a lookup key as a credential
    return "token"


def service_from_name(name: str, *, known_only: bool = False) -> str | None:
    """The service a variable name points at: DEEPSEEK_API_KEY -> DeepSeek, TOKENMALL_KEY -> Tokenmall."""
    segments = _name_segments(name)
    for seg in segments:
        if seg in _SERVICES:
            return _SERVICES[seg]
    if known_only:
        return None
    for seg in segments:
        if seg in _SECRET_SEGMENTS or seg.endswith(_SECRET_SUFFIXES) or seg in _NOT_SERVICES:
            continue
        if seg.isdigit() or len(seg) < 3:
            continue
        return seg.capitalize()
    return None


_TRAILING_WORD_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*[A-Za-z0-9+]|[\u4e00-\u9fff]{2,8}|[A-Za-z])\W*$")
_CJK_SERVICE_SUFFIX_RE = re.compile(r"(?:的|之)$")


def _service_before(text: str, start: int, *, window: int = 48) -> str | None:
    """The service named just before a cue: 'here is the TokenMall key' -> TokenMall."""
    lo = max(0, start - window)
    before = text[lo:start]
    nl = before.rfind("\n")
    if nl >= 0:
        before = before[nl + 1 :]
    before = _CJK_SERVICE_SUFFIX_RE.sub("", before.rstrip()).rstrip()
    before = re.sub(r"(?i)(?:'s|’s)$", "", before).rstrip()
    # skip qualifiers: "TokenMall API key", "GitHub personal access token"
    for _ in range(3):
        m = _TRAILING_WORD_RE.search(before)
        if not m:
            return None
        word = m.group(1)
        low = word.lower()
        if low in _SERVICES:
            return _SERVICES[low]
        if low in _NOT_SERVICES or low in ("api", "access", "secret", "personal", "bot", "app"):
            before = _CJK_SERVICE_SUFFIX_RE.sub("", before[: m.start()].rstrip()).rstrip()
            continue
        if "\u4e00" <= word[0] <= "\u9fff":
            # a CJK run has no word breaks: only a known name inside it is a service
            return next((svc for cjk, svc in _SERVICES.items() if not cjk.isascii() and cjk in word), None)
        if any(c.isupper() for c in word) or any(c.isdigit() for c in word):
            return word
        return None
    return None


# The header of the block a value sits in: `"raven": {`, `provider "blocknative" {`, `[stripe]`, `sendgrid:`
_BLOCK_HEADER_RE = re.compile(
    r"[ \t]*(?:[A-Za-z_]+[ \t]+)?[\"'\[]?(?P<name>[A-Za-z][A-Za-z0-9_.\-]{1,40})[\"'\]]?"
    r"[ \t]*(?::[ \t]*\{?|=?[ \t]*\{)?[ \t]*"
)


def _service_of_block(text: str, start: int, *, lines: int = 3) -> str | None:
    """The known service that names the block around a cue on its own line, within a few lines up:
    `{"raven": {\n  "key": "…"` and Terraform's `provider "datadog" {\n  api_key = "…"` -> the provider."""
    end = text.rfind("\n", 0, start)
    for _ in range(lines):
        if end < 0:
            return None
        begin = text.rfind("\n", 0, end) + 1
        header = _BLOCK_HEADER_RE.fullmatch(text, begin, end)
        if header is not None and text[begin:end].rstrip().endswith(("{", ":", "]")):
            return service_from_name(header.group("name"), known_only=True)
        end = begin - 1
    return None


def _service_of_target(target: str | None) -> str | None:
    """'password for the GitLab admin panel' -> GitLab; 'for the router' -> router."""
    if not target:
        return None
    words = [w for w in re.split(r"\s+", target.strip()) if w]
    while words and words[0].lower() in _NOT_SERVICES:
        words.pop(0)
    for word in words:
        if word.lower() in _SERVICES:
            return _SERVICES[word.lower()]
    return " ".join(words[:3]) or None


# Provider names that are also English words: they name a provider only when written with a capital
# ("ask Square", not "a square root"; "LINE", not "line 12").
_WORD_SERVICES = frozenset(
    """
    line linear square together vault resend notion render railway neon convex segment sanity elastic
    particle harness sauce octopus kraken lob sonar alchemy clerk pusher fauna amplitude prefect looker
    plaid beamer duffel blynk replicate
    """.split()  # noqa: SIM905 - a word list reads better as text
) | frozenset(
    """
    agora airship apollo artsy autopilot blogger cicero cloze coda column copper courier dandelion debounce
    delighted deputy ditto enigma envoy eraser fulcrum harvest humanity hunter impala kickbox mite monday
    nightfall nimble noticeable overloop percy polygon privacy ramp raven refiner semaphore shortcut smooch
    snowflake streak swell tableau teletype twist
    """.split()  # noqa: SIM905
)


def _ascii_alnum(ch: str) -> bool:
    return ch.isascii() and ch.isalnum()


# Names are looked up by the runs of letters and digits around a key (a dict lookup per run: ~900 names),
# names with a separator in them (`fly.io`, `ms teams`) by one regex, names in Chinese by search.
_RUN_RE = re.compile(r"[a-z0-9]+")
_RUN_NAMES = frozenset(w for w in _SERVICES if _RUN_RE.fullmatch(w))
_JOINED_NAME_RE = re.compile(
    "(?=(" + "|".join(re.escape(w) for w in sorted(_SERVICES, key=len, reverse=True)
                      if w.isascii() and w not in _RUN_NAMES) + "))"
)
_CJK_NAMES = tuple(w for w in _SERVICES if not w.isascii())


# What follows a provider's name in one word: `HubspotApiKey`, `snykkey`, `SentryToken`, `aws2`.
_NAME_TAIL_RE = re.compile(r"(?:api|key|keys|token|tokens|secret|oauth2?|personal|access|pat|v?\d+)$")


def _run_name(run: str) -> str | None:
    """The provider a run of letters and digits names, alone or with a key word or a number after it."""
    for _ in range(4):
        if run in _RUN_NAMES:
            return run
        shorter = _NAME_TAIL_RE.sub("", run)
        if shorter == run or len(shorter) < 2:
            return None
        run = shorter
    return None


def _known_service_near(text: str, start: int, *, window: int = 80) -> str | None:
    """A known provider named shortly before a shared-format key ('DeepSeek: sk-...'): the last one."""
    lo = max(0, start - window)
    raw = text[lo:start]
    before = raw.lower()
    if not before or before.isspace():  # a key on its own (an id field): no name to look for
        return None
    found: list[tuple[int, int, str]] = []  # (position, length of the word, name)
    for m in _RUN_RE.finditer(before):
        name = _run_name(m.group())
        if name is not None:
            found.append((m.start(), len(m.group()), name))  # the whole run is the word
    for m in _JOINED_NAME_RE.finditer(before):
        found.append((m.start(), len(m.group(1)), m.group(1)))
    for word in _CJK_NAMES:  # CJK may touch the name ("Adobe后台给的是 ...")
        pos = before.rfind(word)
        if pos >= 0:
            found.append((pos, len(word), word))
    for pos, length, word in sorted(found, reverse=True):
        if word.isascii():  # whole words only for ASCII names ("line" must not match "online")
            left = before[pos - 1] if pos > 0 else " "
            right = before[pos + length] if pos + length < len(before) else " "
            if _ascii_alnum(left) or (right.isascii() and right.isalpha()):
                continue
            if word in _WORD_SERVICES and not raw[pos].isupper():
                continue
        return _SERVICES[word]
    return None
