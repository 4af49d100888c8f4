"""Cross-language agent memories: English queries for Chinese and Japanese memories, and the reverse.

People who work in two or three languages store a fact in one and ask for it in whichever comes
first. Each item: `lang` = "<memory language>-<query language>" (en-zh: English memory, Chinese
query; zh-en: Chinese memory, English query; likewise ja), `memory`, `query` (must find `memory`
first), `distractors` (same topic or same entity, in the memory's language or the query's, so that
matching the topic, the entity or the language alone is not enough).

Written for this project (not translated from any benchmark); the queries are reworded, not
translations of the memory, and keep a name or tool only where a person would type it.
`OFF_TOPIC_EN` / `OFF_TOPIC_CJK`: questions nothing in a memory store like this one answers, for
the relevance floor (held out: the floor was chosen on bench/retrieval_study.py's own lists).
"""

from __future__ import annotations

XLING_SET: list[dict[str, object]] = [
    # --- English query, Chinese memory ---
    {
        "lang": "zh-en",
        "memory": "我对青霉素过敏，去医院看病时一定要提醒医生。",
        "query": "Which antibiotic is the user allergic to?",
        "distractors": ["我妈妈对海鲜过敏，吃虾会起疹子。", "Remind me to book a doctor's appointment next week."],
    },
    {
        "lang": "zh-en",
        "memory": "生产环境的 Redis 密码每九十天轮换一次，由运维组负责。",
        "query": "How often do we rotate the Redis credentials in production?",
        "distractors": ["测试环境的 Redis 不需要密码，只能内网访问。",
                        "Redis is used as the session cache for the web app."],
    },
    {
        "lang": "zh-en",
        "memory": "我女儿下个月十号过生日，想给她买一辆自行车。",
        "query": "What present am I planning for my daughter?",
        "distractors": ["女儿的钢琴课改到了每周六上午。", "My son's birthday party is at the bowling alley."],
    },
    {
        "lang": "zh-en",
        "memory": "新办公室在深圳南山区科技园，地铁一号线高新园站下车。",
        "query": "Where is the new office located?",
        "distractors": ["旧办公室的租约到今年年底就结束了。", "The office Wi-Fi password changes every month."],
    },
    {
        "lang": "zh-en",
        "memory": "周报每周五下午五点前发给李总，抄送整个团队。",
        "query": "When is the weekly report due and who gets it?",
        "distractors": ["月报由财务部整理，每月三号发出。", "Li is on vacation until the end of the month."],
    },
    {
        "lang": "zh-en",
        "memory": "我们决定把前端从 Vue 迁移到 React，预计三个月完成。",
        "query": "Which framework is the frontend moving to?",
        "distractors": ["后端继续使用 Go，不做改动。", "The React docs site has a new tutorial."],
    },
    {
        "lang": "zh-en",
        "memory": "我晚上十一点以后不想收到工作消息，除非是线上事故。",
        "query": "Are there hours when I shouldn't be pinged about work?",
        "distractors": ["早上八点半有一个固定的站会。", "Send me the incident report when it is ready."],
    },
    {
        "lang": "zh-en",
        "memory": "家里的路由器管理地址是 192.168.31.1，型号是小米 AX3600。",
        "query": "What model is the home router?",
        "distractors": ["公司的交换机是华为的，放在三楼机房。", "The router in the lab needs a firmware update."],
    },
    {
        "lang": "zh-en",
        "memory": "我是素食者，但可以吃鸡蛋和牛奶。",
        "query": "Does the user eat meat?",
        "distractors": ["我喜欢吃辣，尤其是川菜。", "The team lunch is at an Italian place on Friday."],
    },
    {
        "lang": "zh-en",
        "memory": "博士论文答辩定在明年三月，导师是陈教授。",
        "query": "When is the PhD defense scheduled?",
        "distractors": ["陈教授下学期去美国访问半年。", "My master's thesis was about graph databases."],
    },
    # --- English query, Japanese memory ---
    {
        "lang": "ja-en",
        "memory": "毎朝七時に犬の散歩をしているので、その時間は返信できません。",
        "query": "Why can't I answer messages early in the morning?",
        "distractors": ["犬の予防接種は来月です。", "Morning meetings start at nine."],
    },
    {
        "lang": "ja-en",
        "memory": "本番のデプロイは必ず火曜日と木曜日の午後に行うルールです。",
        "query": "On which days are we allowed to deploy to production?",
        "distractors": ["ステージング環境はいつでもデプロイしてよい。",
                        "The deploy script lives in the ops repository."],
    },
    {
        "lang": "ja-en",
        "memory": "妻の誕生日は十二月三日で、毎年フレンチレストランを予約しています。",
        "query": "What do I usually do for my wife's birthday?",
        "distractors": ["結婚記念日は六月です。", "My wife's sister lives in Osaka."],
    },
    {
        "lang": "ja-en",
        "memory": "社内の質問はSlackではなくTeamsのヘルプデスクチャンネルに投稿してください。",
        "query": "Where should internal questions be posted?",
        "distractors": ["Slackの有料プランは来年で解約する予定です。", "Teams meetings are recorded automatically."],
    },
    {
        "lang": "ja-en",
        "memory": "花粉症がひどいので、春は外での打ち合わせを避けたいです。",
        "query": "Why does the user avoid outdoor meetings in spring?",
        "distractors": ["夏は暑いので在宅勤務が多くなります。", "The spring offsite is in Kyoto."],
    },
    {
        "lang": "ja-en",
        "memory": "経費精算は月末の三営業日前までに申請しないと翌月扱いになります。",
        "query": "What is the deadline for submitting expense claims?",
        "distractors": ["交通費は定期券の区間外だけ請求できます。", "Expense reports need a receipt photo."],
    },
    {
        "lang": "ja-en",
        "memory": "私のメインの開発マシンはM2のMacBook Airで、メモリは16GBです。",
        "query": "How much RAM does my main laptop have?",
        "distractors": ["会社から支給されたのはThinkPadです。", "The build server has 64 GB of memory."],
    },
    {
        "lang": "ja-en",
        "memory": "来週の金曜日は息子の運動会なので有給を取ります。",
        "query": "Why am I taking next Friday off?",
        "distractors": ["息子は水泳教室に通っています。", "The Friday release was moved to Monday."],
    },
    {
        "lang": "ja-en",
        "memory": "データベースのバックアップは毎晩二時にS3へ保存され、三十日間保持されます。",
        "query": "How long are the nightly database backups kept?",
        "distractors": ["ログは九十日でローテーションされます。", "The S3 bucket for images is public."],
    },
    {
        "lang": "ja-en",
        "memory": "コーヒーは飲めないので、打ち合わせでは緑茶をお願いします。",
        "query": "What should I be served to drink at meetings?",
        "distractors": ["会議室の予約は前日までに必要です。", "There is a new coffee machine on the second floor."],
    },
    # --- Chinese query, English memory ---
    {
        "lang": "en-zh",
        "memory": "The staging cluster runs on three t3.large nodes in eu-west-1.",
        "query": "预发布环境的集群用的是什么规格的机器？",
        "distractors": ["Production runs on twelve m5.xlarge nodes in us-east-1.", "集群的监控告警发到值班群。"],
    },
    {
        "lang": "en-zh",
        "memory": "I prefer to be called Sam, not Samuel.",
        "query": "我应该怎么称呼用户？",
        "distractors": ["Samuel Jackson is my favourite actor.", "My manager's name is Rebecca."],
    },
    {
        "lang": "en-zh",
        "memory": "My flight to Tokyo leaves on June 14th at 9:40 from Heathrow.",
        "query": "去东京的航班是哪天起飞？",
        "distractors": ["The hotel in Tokyo is booked for five nights.", "回程的火车票还没买。"],
    },
    {
        "lang": "en-zh",
        "memory": "We agreed that code reviews need two approvals before merging to main.",
        "query": "合并代码到主分支之前需要几个人审批？",
        "distractors": ["Code style is enforced with ruff in CI.", "主分支每天晚上自动打标签。"],
    },
    {
        "lang": "en-zh",
        "memory": "My blood type is O negative.",
        "query": "用户是什么血型？",
        "distractors": ["I donated blood last spring.", "我的体检报告下周出来。"],
    },
    {
        "lang": "en-zh",
        "memory": "The quarterly planning meeting moved from Monday to Wednesday afternoon.",
        "query": "季度规划会改到哪天了？",
        "distractors": ["The all-hands is on the first Monday of each month.", "规划文档放在共享盘里。"],
    },
    {
        "lang": "en-zh",
        "memory": "My cat Mochi needs her thyroid pill every morning with food.",
        "query": "猫每天早上要吃什么药？",
        "distractors": ["Mochi's favourite toy is a feather wand.", "我邻居家的狗很吵。"],
    },
    {
        "lang": "en-zh",
        "memory": "The invoice for the design agency is paid by bank transfer within 30 days.",
        "query": "设计公司的发票怎么付款？",
        "distractors": ["The design agency delivered the new logo last week.", "报销需要发票原件。"],
    },
    {
        "lang": "en-zh",
        "memory": "I'm learning to play the cello and practise every evening for half an hour.",
        "query": "用户在学什么乐器？",
        "distractors": ["My daughter plays the violin in the school orchestra.", "周末想去听音乐会。"],
    },
    {
        "lang": "en-zh",
        "memory": "Our VPN uses WireGuard; the config file is distributed through the password manager.",
        "query": "公司的VPN是用什么协议的？",
        "distractors": ["The password manager is 1Password for the whole team.", "VPN 在国内有时候连不上。"],
    },
    # --- Japanese query, English memory ---
    {
        "lang": "en-ja",
        "memory": "My dentist appointment is on Thursday at 4 pm.",
        "query": "歯医者の予約はいつ？",
        "distractors": ["The eye doctor said my prescription hasn't changed.", "木曜日の夜は飲み会があります。"],
    },
    {
        "lang": "en-ja",
        "memory": "The assistant's name is Aria and it should answer in a friendly, concise tone.",
        "query": "アシスタントの名前は何？",
        "distractors": ["Aria is also the name of my neighbour's daughter.", "返信はできるだけ短くしてほしい。"],
    },
    {
        "lang": "en-ja",
        "memory": "We are migrating the monitoring stack from Nagios to Prometheus and Grafana.",
        "query": "監視ツールは何に移行していますか？",
        "distractors": ["Grafana dashboards are shared with the support team.", "ログ収集にはFluentdを使っています。"],
    },
    {
        "lang": "en-ja",
        "memory": "I moved to Fukuoka last April for a new job at a game studio.",
        "query": "ユーザーはどこに引っ越しましたか？",
        "distractors": ["My parents still live in Sapporo.", "ゲームスタジオの面接は三回ありました。"],
    },
    {
        "lang": "en-ja",
        "memory": "Please never schedule meetings before 10 am; I take my kids to school.",
        "query": "午前中の早い時間に会議を入れてはいけない理由は？",
        "distractors": ["The kids' school has a parents' evening next week.", "会議室は十階にあります。"],
    },
    {
        "lang": "en-ja",
        "memory": "The API rate limit for the partner integration is 600 requests per minute.",
        "query": "パートナー連携のAPIは一分間に何回まで呼べる？",
        "distractors": ["The partner integration uses OAuth client credentials.", "APIのドキュメントは英語だけです。"],
    },
    {
        "lang": "en-ja",
        "memory": "I'm training for the Osaka marathon in February; long runs are on Sundays.",
        "query": "日曜日に長い距離を走っているのはなぜ？",
        "distractors": ["My knee hurt after the trail race last year.", "大阪の実家には年末に帰ります。"],
    },
    {
        "lang": "en-ja",
        "memory": "The office is closed from December 29 to January 3 for the new year holidays.",
        "query": "年末年始の休業期間は？",
        "distractors": ["The office party is on December 20.", "年明けに新しいプロジェクトが始まる。"],
    },
    {
        "lang": "en-ja",
        "memory": "My wife is allergic to buckwheat, so avoid soba restaurants when booking dinner.",
        "query": "妻が食べられないものは？",
        "distractors": ["We had soba in Nagano during the trip.", "夕食の予約は七時にしてください。"],
    },
    {
        "lang": "en-ja",
        "memory": "The release notes are written in English first and translated by the Tokyo team.",
        "query": "リリースノートの翻訳は誰が担当している？",
        "distractors": ["The Tokyo team moved to a new office in Shibuya.", "リリースは毎月第二火曜日です。"],
    },
]

# Questions nothing above answers, in the languages of the set; held out from the floor's choice.
OFF_TOPIC_EN = [
    "What is the melting point of tungsten?",
    "Who painted the ceiling of the Sistine Chapel?",
    "How do I compile a Linux kernel module?",
    "What is the capital of Mongolia?",
    "How many players are on a rugby union team?",
    "What does the Krebs cycle produce?",
    "How do I enable HTTP/3 in nginx?",
    "When was the printing press invented?",
    "What is the derivative of arctan(x)?",
    "How far is Mars from the Sun?",
    "What is the difference between a virus and a bacterium?",
    "How do I sort a list of tuples by the second element in Python?",
    "Who wrote One Hundred Years of Solitude?",
    "What is the longest river in South America?",
    "How do I change a bicycle inner tube?",
    "What is the half-life of carbon-14?",
    "Which planet has the most moons?",
    "How do solar panels convert light into electricity?",
    "What is the rule of thirds in photography?",
    "How do I make sourdough starter?",
]
OFF_TOPIC_CJK = [
    "珠穆朗玛峰有多高？",
    "如何用Python读取Excel文件？",
    "秦始皇统一六国是在哪一年？",
    "黑洞是怎么形成的？",
    "怎么做红烧肉？",
    "地球到月球的距离是多少？",
    "相对论的基本原理是什么？",
    "如何配置Nginx反向代理？",
    "太阳系有几颗行星？",
    "人体有多少块骨头？",
    "東京タワーの高さは何メートルですか？",
    "源氏物語の作者は誰ですか？",
    "味噌汁の作り方を教えてください。",
    "量子もつれとは何ですか？",
    "Dockerのイメージを削除するコマンドは？",
    "日本で一番長い川はどこ？",
    "ビタミンCが多い果物は？",
    "江戸幕府を開いたのは誰？",
    "二次方程式の解の公式を教えて。",
    "オーロラはなぜ光るのですか？",
]


def pool() -> list[str]:
    """Every memory and distractor of the set, memories first in item order (index i = item i)."""
    texts = [str(item["memory"]) for item in XLING_SET]
    for item in XLING_SET:
        distractors = item["distractors"]
        assert isinstance(distractors, list)
        texts.extend(str(d) for d in distractors)
    return texts
