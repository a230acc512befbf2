"""RocketMQ 4 remoting numbers: request codes, response codes, languages, flags.

Only the codes Quarry answers or names in errors (values as in RocketMQ 4.9's RequestCode,
ResponseCode and LanguageCode).
"""
from __future__ import annotations

# Requests a broker answers.
SEND_MESSAGE = 10
PULL_MESSAGE = 11
QUERY_MESSAGE = 12
QUERY_CONSUMER_OFFSET = 14
UPDATE_CONSUMER_OFFSET = 15
UPDATE_AND_CREATE_TOPIC = 17
GET_BROKER_RUNTIME_INFO = 28
SEARCH_OFFSET_BY_TIMESTAMP = 29
GET_MAX_OFFSET = 30
GET_MIN_OFFSET = 31
VIEW_MESSAGE_BY_ID = 33
HEART_BEAT = 34
UNREGISTER_CLIENT = 35
END_TRANSACTION = 37
GET_CONSUMER_LIST_BY_GROUP = 38
CHECK_TRANSACTION_STATE = 39  # sent by the broker to a producer (one-way)
QUERY_TOPIC_CONSUME_BY_WHO = 300
SEND_MESSAGE_V2 = 310
SEND_BATCH_MESSAGE = 320

# Requests a NameServer answers.
GET_KV_CONFIG = 101
GET_ROUTEINFO_BY_TOPIC = 105
GET_BROKER_CLUSTER_INFO = 106
GET_KV_CONFIG_BY_VALUE = 217
GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206

# Response codes.
SUCCESS = 0
SYSTEM_ERROR = 1
SYSTEM_BUSY = 2
REQUEST_CODE_NOT_SUPPORTED = 3
FLUSH_DISK_TIMEOUT = 10
MESSAGE_ILLEGAL = 13
SERVICE_NOT_AVAILABLE = 14
NO_PERMISSION = 16
TOPIC_NOT_EXIST = 17
PULL_NOT_FOUND = 19
PULL_RETRY_IMMEDIATELY = 20
PULL_OFFSET_MOVED = 21
QUERY_NOT_FOUND = 22
SUBSCRIPTION_PARSE_FAILED = 23

# Serialization type: the high byte of the header-length field.
SERIALIZE_JSON = 0
SERIALIZE_ROCKETMQ = 1
SERIALIZE_NAMES = {SERIALIZE_JSON: "JSON", SERIALIZE_ROCKETMQ: "ROCKETMQ"}

# RemotingCommand.flag bits.
FLAG_RESPONSE = 1  # bit 0 (RPC_TYPE): a response
FLAG_ONEWAY = 2  # bit 1 (RPC_ONEWAY): no response wanted

LANGUAGES = ["JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO", "PHP", "OMS", "RUST"]

# PullMessageRequestHeader.sysFlag bits (PullSysFlag).
PULL_COMMIT_OFFSET = 0x1
PULL_SUSPEND = 0x2
PULL_SUBSCRIPTION = 0x4
PULL_CLASS_FILTER = 0x8

# MessageSysFlag bits a sender may set.
SYSFLAG_COMPRESSED = 0x1

# The topic a producer asks for when its own topic has no route yet (auto-creation).
AUTO_CREATE_TOPIC = "TBW102"
# ExtFields key of QUERY_MESSAGE saying the key is a unique key (MixAll.UNIQUE_MSG_QUERY_FLAG).
UNIQUE_KEY_QUERY_FLAG = "_UNIQUE_KEY_QUERY"
