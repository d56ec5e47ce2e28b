{% macro bronze_table_ddl() %}
    {#-
        The bronze contract (docs/bronze.md) as DDL: table name -> (column list, partition columns, table properties).
        Must match ingest/bronze/schemas.py, which skips creating a table dbt already created.
        Used only to create an empty table at a bronze path that ingest has not written yet, so that
        sources always exist.
    -#}
    {{ return({
        'wal_events': {
            'columns': [
                'source string',
                'source_kind string',
                'commit_lsn bigint',
                'commit_index int',
                'end_lsn bigint',
                'xid bigint',
                'commit_timestamp timestamp',
                'action string',
                'table_schema string',
                'table_name string',
                'relation_id bigint',
                'record_pk string',
                'old_record_pk string',
                'record string',
                'old_record string',
                'unchanged_toast array<string>',
                'truncated_tables array<string>',
                'truncate_options int',
                'message_prefix string',
                'message_content string',
                'message_transactional boolean',
                'writer_id string',
                'ingested_at timestamp',
            ],
            'partition_by': ['source'],
            'properties': {
                'delta.appendOnly': 'true',
                'delta.dataSkippingStatsColumns':
                    'commit_lsn,commit_index,action,table_schema,table_name,ingested_at',
            },
        },
        'stream_positions': {
            'columns': [
                'source string',
                'writer_id string',
                'writer_kind string',
                'durable_lsn bigint',
                'ack_lsn bigint',
                'resume_token string',
                'started_at timestamp',
                'updated_at timestamp',
            ],
            'partition_by': ['source', 'writer_id'],
        },
        'source_relations': {
            'columns': [
                'source string',
                'relation_id bigint',
                'table_schema string',
                'table_name string',
                'replica_identity string',
                'columns array<struct<name:string, type_oid:bigint, type_name:string, type_modifier:int, '
                    ~ 'is_key:boolean, pk_position:int, json_kind:string>>',
                'shape_hash string',
                'first_seen_lsn bigint',
                'ingested_at timestamp',
            ],
            'partition_by': ['source'],
        },
        'snapshot_pages': {
            'columns': [
                'source string',
                'source_kind string',
                'snapshot_id string',
                'table_schema string',
                'table_name string',
                'page_number bigint',
                'row_index int',
                'last_page boolean',
                'record_pk string',
                'record string',
                'key_text array<string>',
                'snapshot_xmin bigint',
                'snapshot_xmax bigint',
                'snapshot_xip array<bigint>',
                'high_watermark_lsn bigint',
                'read_at timestamp',
                'writer_id string',
                'ingested_at timestamp',
            ],
            'partition_by': ['source'],
            'properties': {
                'delta.appendOnly': 'true',
                'delta.dataSkippingStatsColumns':
                    'snapshot_id,table_schema,table_name,page_number,high_watermark_lsn',
            },
        },
    }) }}
{% endmacro %}
