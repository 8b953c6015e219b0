"""Privacy contracts every layer may import: the subject store (pseudonyms) and the erasure ledger.

``subjects``: users' ids to random pseudonyms, kept by a keyed hash of the id, deleted on erasure
(crypto-shredding). ``ledger``: the append-only, hash-chained record of erasure requests and the pseudonyms whose
events the layers exclude, with the readers the batch exporter, the API and the console use.
"""
