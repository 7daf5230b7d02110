"""Topic matching for the core: the project's one implementation lives in the leaf package
mqtt_topics (shared with sink/); this name stays for code that imports it from the core."""
from mqtt_topics import (SHARE_PREFIX, TopicTrie, matches, parse_shared, valid_topic_filter,  # noqa: F401
                         valid_topic_name)
