"""The cluster-wide controller: Kopf handlers per watched kind, and the explain logic."""
