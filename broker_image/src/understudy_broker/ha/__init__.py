"""High availability: who may read and write right now, and how a group fails over and back.

:mod:`.authority` is the interface the server enforces (static or ZooKeeper-backed);
:mod:`.zkauthority` and :mod:`.coordinator` are the broker's ZooKeeper presence (state and
config watches, status publishing, the in-sync record); :mod:`.lease` the read lease;
:mod:`.backsync` the acting slave's hand-back of consumer offsets; :mod:`.permlog` the
permission-change log the one-reader checker reads.
"""
