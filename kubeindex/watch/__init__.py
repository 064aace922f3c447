"""The watches: reflectors (list, then watch, as client-go's), the sources that start and stop
them as kinds are needed, discovery of served kinds, owner kinds, the fleet's members, and the
watches' own metrics. The client feeding the model."""
