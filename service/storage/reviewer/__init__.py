"""The reviewer surface: queries, the access log, the role guard."""
