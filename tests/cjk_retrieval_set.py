"""Chinese/Japanese agent memories with reworded queries and same-entity distractors (hybrid search).

Complements `tests/cjk_set.py` (the embedder study's set, whose queries avoid any keyword overlap
by design, so only a dense model can answer them). Here the queries are what a user or agent
actually types: reworded, but keeping the name, tool or place they ask about. Every memory has
distractors that share that entity and differ in what is asked, so matching the entity alone
(what a keyword index does) ties, and matching the topic alone (what a dense model often does)
is not enough either. Markdown scaffolding sits in the pool as well: the memory system this
project grew from ranked a heading above the right Chinese sentence.

Each item: `lang`, `memory`, `query` (must find `memory` first), `distractors` (share its entity).
"""

from __future__ import annotations

CJK_RETRIEVAL_SET: list[dict[str, object]] = [
    # --- Chinese ---
    {
        "lang": "zh",
        "memory": "生产数据库的端口从5432改成了6432，因为前面加了PgBouncer连接池。",
        "query": "为什么线上数据库换了端口号？",
        "distractors": ["测试环境的数据库依然使用默认的5432端口。", "PgBouncer的配置文件放在/etc/pgbouncer目录下。"],
    },
    {
        "lang": "zh",
        "memory": "团队约定每周五下午不做上线发布，紧急修复除外。",
        "query": "周五能不能发版？",
        "distractors": ["每周一上午十点开周会，讨论本周的发布计划。"],
    },
    {
        "lang": "zh",
        "memory": "王经理对花生过敏，订团餐时要避开花生。",
        "query": "给王经理订餐要注意什么？",
        "distractors": ["王经理下个月调到深圳分公司。"],
    },
    {
        "lang": "zh",
        "memory": "我家的猫叫豆豆，是一只三岁的英短蓝猫。",
        "query": "豆豆是什么品种的猫？",
        "distractors": ["豆豆今天早上去宠物医院打了疫苗。"],
    },
    {
        "lang": "zh",
        "memory": "每天凌晨三点自动把数据库备份到对象存储，保留三十天。",
        "query": "数据库的备份会保存多久？",
        "distractors": ["日志每周轮转一次，旧日志压缩后保存。", "对象存储的账单每月大约两百元。"],
    },
    {
        "lang": "zh",
        "memory": "API密钥每九十天轮换一次，由运维组负责执行。",
        "query": "密钥多长时间更换一次？",
        "distractors": ["新员工入职第一天需要申请VPN账号和门禁卡。"],
    },
    {
        "lang": "zh",
        "memory": "下周三下午两点和客户开需求评审会，地点在三楼会议室。",
        "query": "跟客户的评审会几点开始？",
        "distractors": ["上周三的客户拜访因为下雨取消了。"],
    },
    {
        "lang": "zh",
        "memory": "内存泄漏的原因是缓存没有设置过期时间，现在加了一小时的TTL。",
        "query": "内存一直上涨的问题是怎么修好的？",
        "distractors": ["CPU占用过高是因为日志级别开成了DEBUG。"],
    },
    {
        "lang": "zh",
        "memory": "项目统一使用Python 3.11，不要再写兼容3.8的代码。",
        "query": "这个项目用哪个Python版本？",
        "distractors": ["前端项目使用Node 20和pnpm管理依赖。"],
    },
    {
        "lang": "zh",
        "memory": "我们计划明年三月从上海搬到杭州。",
        "query": "什么时候搬去杭州？",
        "distractors": ["杭州的朋友推荐了几家西湖边的餐厅。"],
    },
    {
        "lang": "zh",
        "memory": "医生建议每周游泳三次来缓解腰痛。",
        "query": "腰疼的话医生让做什么运动？",
        "distractors": ["跑步机坏了，已经联系售后维修。"],
    },
    {
        "lang": "zh",
        "memory": "持续集成变慢是因为每次都重新下载依赖，现在加上了依赖缓存。",
        "query": "CI以前为什么那么慢？",
        "distractors": ["代码合并前至少需要两位同事审核通过。"],
    },
    {
        "lang": "zh",
        "memory": "去日本出差需要提前一个月办理签证。",
        "query": "去日本出差之前要准备什么手续？",
        "distractors": ["上次日本出差住的是新宿的酒店。"],
    },
    {
        "lang": "zh",
        "memory": "妈妈的生日是农历八月十五，正好是中秋节。",
        "query": "妈妈哪天过生日？",
        "distractors": ["妈妈最近在学习用智能手机视频通话。"],
    },
    {
        "lang": "zh",
        "memory": "报销单必须在每月二十五号之前提交给财务。",
        "query": "报销的截止日期是哪天？",
        "distractors": ["财务部上周搬到了五楼。"],
    },
    {
        "lang": "zh",
        "memory": "张伟负责支付模块，有问题直接找他。",
        "query": "支付相关的问题该问谁？",
        "distractors": ["支付宝的手续费是千分之六。"],
    },
    {
        "lang": "zh",
        "memory": "服务器的SSH端口改成了2222，禁止密码登录，只能用密钥。",
        "query": "现在怎么登录服务器？",
        "distractors": ["服务器每个月第一个周日凌晨重启维护。"],
    },
    {
        "lang": "zh",
        "memory": "孩子每周六上午九点有钢琴课，在少年宫。",
        "query": "钢琴课是什么时候上？",
        "distractors": ["家里的钢琴每年需要调一次音。"],
    },
    {
        "lang": "zh",
        "memory": "这个季度的目标是把接口延迟降到一百毫秒以内。",
        "query": "本季度性能方面的指标是多少？",
        "distractors": ["上个季度的目标是完成用户系统重构。"],
    },
    {
        "lang": "zh",
        "memory": "公司年会定在一月二十号，在国际会展中心举办。",
        "query": "年会在哪里开？",
        "distractors": ["年会的节目报名截止到本周五。"],
    },
    # --- Japanese ---
    {
        "lang": "ja",
        "memory": "社内のパスワードはすべて1Passwordで管理することになった。",
        "query": "パスワードはどのツールで管理する？",
        "distractors": ["1Passwordのライセンス費用は年払いです。"],
    },
    {
        "lang": "ja",
        "memory": "田中さんは辛い料理が苦手なので、カレーは甘口にしてください。",
        "query": "田中さんの食事で気をつけることは？",
        "distractors": ["田中さんは来週から大阪に出張です。"],
    },
    {
        "lang": "ja",
        "memory": "次のリリースは4月10日の予定で、機能凍結は4月3日です。",
        "query": "次のリリースはいつですか？",
        "distractors": ["前回のリリースでは不具合が三件見つかった。"],
    },
    {
        "lang": "ja",
        "memory": "本番サーバーは東京リージョンに移行済みで、大阪はバックアップ用です。",
        "query": "本番環境はどこのリージョンで動いている？",
        "distractors": ["大阪オフィスのネットワーク工事は来月です。"],
    },
    {
        "lang": "ja",
        "memory": "うちの犬の名前はポチで、もうすぐ十歳になります。",
        "query": "ポチは何歳？",
        "distractors": ["ポチのドッグフードは毎月通販で買っている。"],
    },
    {
        "lang": "ja",
        "memory": "通勤は毎朝七時半の電車で、新宿駅で乗り換えます。",
        "query": "朝の乗り換えはどこの駅？",
        "distractors": ["新宿駅の近くに新しいカフェができた。"],
    },
    {
        "lang": "ja",
        "memory": "APIのタイムアウトを30秒から60秒に延ばしたら、エラーが減った。",
        "query": "タイムアウトの設定はいくつに変えた？",
        "distractors": ["APIのレスポンスはJSON形式で返す仕様です。"],
    },
    {
        "lang": "ja",
        "memory": "妻の誕生日は十一月三日なので、レストランを予約しておく。",
        "query": "妻の誕生日はいつ？",
        "distractors": ["妻は毎週水曜日にヨガ教室に通っている。"],
    },
    {
        "lang": "ja",
        "memory": "毎晩三十分、中国語の勉強をしています。",
        "query": "夜は何の勉強をしている？",
        "distractors": ["中国語の教科書を友達に貸した。"],
    },
    {
        "lang": "ja",
        "memory": "コードレビューは二人以上の承認が必要で、mainブランチへの直接プッシュは禁止です。",
        "query": "mainに直接pushしてもいい？",
        "distractors": ["mainブランチのビルドが昨日から失敗している。"],
    },
    {
        "lang": "ja",
        "memory": "息子は卵アレルギーがあるので、ケーキを買うときは注意が必要です。",
        "query": "息子が食べられないものは？",
        "distractors": ["息子は来年から小学校に入学します。"],
    },
    {
        "lang": "ja",
        "memory": "ディスクの空き容量が10%を切ったらSlackに通知が届くように設定した。",
        "query": "ディスクが足りなくなったらどうやって分かる？",
        "distractors": ["Slackのワークスペースを新しく作り直した。"],
    },
    {
        "lang": "ja",
        "memory": "来年の春に大阪から福岡へ引っ越す予定です。",
        "query": "福岡にはいつ引っ越す？",
        "distractors": ["福岡のおいしいラーメン屋の情報をまとめた。"],
    },
    {
        "lang": "ja",
        "memory": "健康診断でコレステロールが高めと言われたので、揚げ物を控えています。",
        "query": "どうして揚げ物を食べないの？",
        "distractors": ["健康診断は毎年六月に会社で受ける。"],
    },
    {
        "lang": "ja",
        "memory": "経費精算は毎月25日までに提出しないといけません。",
        "query": "経費精算の締め切りは？",
        "distractors": ["経費で買ったモニターが届いた。"],
    },
    {
        "lang": "ja",
        "memory": "佐藤さんがデータベースの担当なので、障害のときは佐藤さんに連絡してください。",
        "query": "DBのトラブルは誰に相談すればいい？",
        "distractors": ["佐藤さんは釣りが趣味です。"],
    },
    {
        "lang": "ja",
        "memory": "ステージング環境は毎週月曜日の朝にデータがリセットされます。",
        "query": "ステージングのデータはいつ消える？",
        "distractors": ["ステージング環境のURLは社内Wikiに書いてある。"],
    },
    {
        "lang": "ja",
        "memory": "娘のピアノの発表会は十二月十五日の午後です。",
        "query": "ピアノの発表会はいつ？",
        "distractors": ["ピアノの先生が来月引退するそうだ。"],
    },
    {
        "lang": "ja",
        "memory": "今期の目標はAPIの応答時間を100ミリ秒以下にすることです。",
        "query": "今期の性能目標は？",
        "distractors": ["前期の目標は認証基盤の刷新でした。"],
    },
    {
        "lang": "ja",
        "memory": "忘年会は十二月二十日に渋谷の居酒屋でやります。",
        "query": "忘年会の場所はどこ？",
        "distractors": ["忘年会の参加費は一人五千円です。"],
    },
]

# Transcript scaffolding that a weak dense model likes to rank first.
MARKDOWN_NOISE: list[str] = ["## 项目笔记", "# 今日のメモ", "### 待办事项", "---", "## Notes", "# 議事録", "**总结**"]


def pool() -> list[str]:
    """Every text to index: the memories first (index i belongs to item i), then distractors, then noise."""
    memories = [str(item["memory"]) for item in CJK_RETRIEVAL_SET]
    distractors = [str(d) for item in CJK_RETRIEVAL_SET for d in item["distractors"]]  # type: ignore[attr-defined]
    return memories + distractors + MARKDOWN_NOISE
