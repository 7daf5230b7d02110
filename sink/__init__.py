"""Analytics sink: broker -> spool -> Kafka -> Spark history table."""
