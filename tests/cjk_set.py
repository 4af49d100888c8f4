"""A small hand-written Chinese/Japanese agent-memory retrieval set, with cross-language pairs.

Each item of `CJK_SET` is a memory an agent might have stored from a conversation and a query
that should find it, worded differently (paraphrase, not keyword overlap). `lang` names the
memory's language, then the query's when they differ: "zh", "ja", "zh-en" (Chinese memory,
English query), "en-zh", "ja-en", "en-ja".

`DISTRACTORS` are memories no query targets; most are deliberately close in topic to a real one
(another allergy, another manager, another city), so a model must match meaning, not topic.

Evaluation used by bench/embedders.py and the retrieval helpers: index every memory of the set
plus every distractor in one pool, run each query, and score the rank of its own memory.
"""

from __future__ import annotations

CJK_SET: list[dict[str, str]] = [
    # --- Chinese ---
    {"lang": "zh", "memory": "我对花生过敏，点外卖的时候一定要避开含花生的菜。", "query": "用户有什么东西不能吃？"},
    {"lang": "zh", "memory": "下周三下午三点要和王经理开季度预算评审会。", "query": "什么时候跟王经理讨论钱的安排？"},
    {"lang": "zh", "memory": "我女儿叫小雨，今年九月上小学一年级。", "query": "孩子哪个月开始念书？"},
    {
        "lang": "zh",
        "memory": "公司的测试服务器部署在阿里云杭州区域，生产环境在上海。",
        "query": "测试环境的机器放在哪个城市？",
    },
    {"lang": "zh", "memory": "我每天早上六点半去公园跑步，大概跑五公里。", "query": "用户平时有什么晨练习惯？"},
    {"lang": "zh", "memory": "写脚本我更喜欢用 Python，不太喜欢 Shell。", "query": "做自动化工具时偏好哪种编程语言？"},
    {"lang": "zh", "memory": "这个月的房租已经交了，是通过支付宝转给房东的。", "query": "住的地方的费用是怎么付的？"},
    {"lang": "zh", "memory": "老家在四川成都，春节打算回去看父母。", "query": "过年准备去哪里？"},
    {"lang": "zh", "memory": "我的猫叫橘子，最近胃口不好，周六要带它去宠物医院。", "query": "家里的宠物生病了吗？"},
    {"lang": "zh", "memory": "项目的截止日期从十月十五号推迟到了十一月一号。", "query": "交付时间改到什么时候了？"},
    {"lang": "zh", "memory": "我在学日语，目标是明年七月考过N2。", "query": "用户在准备什么语言考试？"},
    {
        "lang": "zh",
        "memory": "数据库备份每天凌晨两点自动执行，保留最近三十天。",
        "query": "数据多久存档一次，留多长时间？",
    },
    {"lang": "zh", "memory": "我不喝咖啡，下午一般只喝绿茶。", "query": "给他准备什么饮料比较合适？"},
    {"lang": "zh", "memory": "周末想带家人去杭州西湖玩两天，需要订酒店。", "query": "假期出游需要预订住宿。"},
    # --- Japanese ---
    {"lang": "ja", "memory": "来月から大阪支社に転勤することになりました。", "query": "新しい勤務地はどこですか？"},
    {"lang": "ja", "memory": "歯医者の予約は木曜日の午後四時です。", "query": "歯の治療はいつ行く予定？"},
    {
        "lang": "ja",
        "memory": "息子はサッカー部に入っていて、毎週土曜日に試合があります。",
        "query": "子供は週末に何の部活をしている？",
    },
    {
        "lang": "ja",
        "memory": "辛い食べ物が苦手なので、カレーはいつも甘口にしています。",
        "query": "刺激の強い料理は食べられますか？",
    },
    {
        "lang": "ja",
        "memory": "本番環境へのデプロイは金曜日には行わないルールです。",
        "query": "リリースを避けるべき曜日は？",
    },
    {
        "lang": "ja",
        "memory": "妻の誕生日は三月十二日で、毎年花束を贈っています。",
        "query": "配偶者の記念日には何をプレゼントする？",
    },
    {
        "lang": "ja",
        "memory": "新しいノートパソコンは MacBook Air で、メモリは16GBです。",
        "query": "使っている端末のスペックを教えて。",
    },
    {"lang": "ja", "memory": "毎朝電車で一時間かけて通勤しています。", "query": "会社まではどれくらいかかる？"},
    {"lang": "ja", "memory": "英会話教室に週二回通っています。", "query": "語学のレッスンはどのくらいの頻度？"},
    {
        "lang": "ja",
        "memory": "実家の犬が十五歳になり、最近足腰が弱ってきました。",
        "query": "飼っている動物が年を取ってきた話。",
    },
    {"lang": "ja", "memory": "来年の春に結婚式を挙げる予定で、会場は京都です。", "query": "挙式はいつ、どこで？"},
    {"lang": "ja", "memory": "月末までに経費精算を提出しなければなりません。", "query": "立て替えた費用の申請期限は？"},
    {
        "lang": "ja",
        "memory": "毎晩寝る前に三十分ほど読書をする習慣があります。",
        "query": "就寝前にいつも何をしている？",
    },
    {
        "lang": "ja",
        "memory": "パスワードの管理には 1Password を使っています。",
        "query": "認証情報はどのツールで保存している？",
    },
    # --- Chinese memory, English query ---
    {"lang": "zh-en", "memory": "我下个月要去东京出差一周。", "query": "When is the business trip to Japan?"},
    {"lang": "zh-en", "memory": "我的血型是O型。", "query": "What is the user's blood type?"},
    {
        "lang": "zh-en",
        "memory": "我们团队用 GitLab 做代码审查。",
        "query": "Which platform does the team review code on?",
    },
    {"lang": "zh-en", "memory": "我每周二和周四晚上去健身房。", "query": "Which evenings does the user work out?"},
    {"lang": "zh-en", "memory": "我妈妈下周六过六十岁生日。", "query": "When is mom's 60th birthday?"},
    {
        "lang": "zh-en",
        "memory": "服务器的磁盘快满了，需要清理日志。",
        "query": "The server is running out of storage space.",
    },
    # --- English memory, Chinese query ---
    {
        "lang": "en-zh",
        "memory": "I switched my phone plan to China Mobile last week.",
        "query": "用户现在用哪家手机运营商？",
    },
    {"lang": "en-zh", "memory": "My flight back to Beijing lands at 9 pm on Sunday.", "query": "回北京的航班几点到？"},
    {"lang": "en-zh", "memory": "I'm vegetarian, so no meat or fish please.", "query": "他吃肉吗？"},
    {
        "lang": "en-zh",
        "memory": "The API rate limit is 100 requests per minute.",
        "query": "接口每分钟最多能调用多少次？",
    },
    {"lang": "en-zh", "memory": "My brother is studying medicine in Shanghai.", "query": "家里谁在学医？"},
    {
        "lang": "en-zh",
        "memory": "Please send the weekly report every Friday before 5 pm.",
        "query": "周报什么时候要交？",
    },
    # --- Japanese <-> English ---
    {"lang": "ja-en", "memory": "毎月の家賃は八万円です。", "query": "How much is the monthly rent?"},
    {"lang": "ja-en", "memory": "週末は富士山に登る予定です。", "query": "What are the hiking plans for the weekend?"},
    {"lang": "en-ja", "memory": "I take my allergy medicine every morning.", "query": "毎朝飲んでいる薬は？"},
    {
        "lang": "en-ja",
        "memory": "The office wifi password is kept in the shared vault.",
        "query": "オフィスのネット接続情報はどこにある？",
    },
]

DISTRACTORS: list[dict[str, str]] = [
    # Chinese, each near one of the memories above in topic
    {"lang": "zh", "memory": "我对猫毛有点过敏，但还是很喜欢猫。"},
    {"lang": "zh", "memory": "上周三和李经理吃了午饭，聊了招聘的事。"},
    {"lang": "zh", "memory": "儿子今年高考，成绩还不错。"},
    {"lang": "zh", "memory": "阿里云的账单这个月比上个月高了百分之二十。"},
    {"lang": "zh", "memory": "晚上有时候去游泳，每次游一个小时。"},
    {"lang": "zh", "memory": "同事推荐我学 Rust，但我还没开始。"},
    {"lang": "zh", "memory": "水电费每两个月交一次。"},
    {"lang": "zh", "memory": "去年国庆去了一趟重庆，火锅很好吃。"},
    {"lang": "zh", "memory": "项目的需求文档还需要产品经理再确认一下。"},
    {"lang": "zh", "memory": "最近在追一部韩剧，每天晚上看两集。"},
    {"lang": "zh", "memory": "服务器的监控告警会发到钉钉群里。"},
    {"lang": "zh", "memory": "我想换一台新的笔记本电脑，预算八千块。"},
    # Japanese
    {"lang": "ja", "memory": "大阪出身の同僚がたこ焼きを持ってきてくれました。"},
    {"lang": "ja", "memory": "眼科の検査は先月終わりました。"},
    {"lang": "ja", "memory": "娘はピアノを習っていて、発表会は十二月です。"},
    {"lang": "ja", "memory": "甘いものは好きですが、最近は控えています。"},
    {"lang": "ja", "memory": "テスト環境のデータベースは毎週月曜日にリセットされます。"},
    {"lang": "ja", "memory": "母の日にはカーネーションを贈りました。"},
    {"lang": "ja", "memory": "古いスマホのバッテリーがすぐ切れるので買い替えたい。"},
    {"lang": "ja", "memory": "休日は自転車で近所を走ることが多いです。"},
    {"lang": "ja", "memory": "中国語の勉強を始めたばかりです。"},
    {"lang": "ja", "memory": "猫を飼いたいけど、マンションはペット禁止です。"},
    {"lang": "ja", "memory": "来週の会議はすべてオンラインになりました。"},
    {"lang": "ja", "memory": "経費の上限は一回あたり五千円です。"},
    # English
    {"lang": "en", "memory": "I visited Osaka for a conference two years ago."},
    {"lang": "en", "memory": "My sister works as a nurse in Guangzhou."},
    {"lang": "en", "memory": "The staging database is reset every Monday morning."},
    {"lang": "en", "memory": "Our team moved from Jira to Linear in March."},
    {"lang": "en", "memory": "I usually go running on weekends, not weekdays."},
    {"lang": "en", "memory": "Dad's birthday dinner was last Saturday."},
    {"lang": "en", "memory": "Lunch meetings on Tuesdays are optional."},
    {"lang": "en", "memory": "The VPN configuration file is in the IT wiki."},
]


def pool() -> list[str]:
    """Every text to index: the set's memories (index i belongs to CJK_SET[i]), then distractors."""
    return [item["memory"] for item in CJK_SET] + [item["memory"] for item in DISTRACTORS]
