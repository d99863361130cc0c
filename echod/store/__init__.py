"""echod's store: everything between a batch fleetd forwarded and PostgreSQL, one way.

Each module imports only those listed before it (``tests/test_package.py`` holds it):

- ``summaries``: the per-call summaries' SQL and buckets (pure);
- ``models``: the tables, as SQLAlchemy declares them;
- ``db``: engines, migrations, partitions and the locks that order writers and retention;
- ``jobrecords``: a job's record from its start and end events, merged and upserted;
- ``checks``: each row of a batch checked on its own, what the good ones tell gathered;
- ``attrsjson``: a push of columns' attributes as the JSON a row's would be;
- ``chunks``: the frequent calls of a push of columns kept as chunks, summarized as stored;
- ``columnrows``: a push of columns staged as rows and chunks, a column at a time;
- ``writer``: one batch written in one transaction (``write_batch``), or in parts where the
  database refuses rows of it;
- ``retention``: what is older than the store keeps, dropped a day at a time.

Importing the package imports none of them: the tools read ``models`` without loading the
writer.
"""
