"""The broker server: :mod:`.broker` wires and runs a broker; :mod:`.requests` handles each
operation; :mod:`.connections` owns the client port; :mod:`.replica` is the role (master or
slave) half; :mod:`.http` and :mod:`.metrics` the side port and its series.
"""
