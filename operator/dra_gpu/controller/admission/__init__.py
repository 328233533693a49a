"""The admission webhook: our driver's opaque configs refused at ``kubectl apply`` when prepare
would refuse them, and claims nothing can satisfy now admitted with a warning.

Served by every controller replica through Kopf (``on.validate``) at the paths of the chart's
ValidatingWebhookConfiguration, whose ``matchConditions`` send only objects with a config for
our driver. The parts, each one concern:

- ``review`` (pure): the three kinds, the refusal (``devices.opaque``'s decoder, the one prepare
  runs) and the warning (an explanation that no allocation changes);
- ``handlers``: the Kopf validators and the admission metrics;
- ``certificates`` (pure): the self-issued CA and serving certificate, when they are due;
- ``keeper``: the Secret the leader keeps them in, the files every replica serves, the caBundle;
- ``server``: Kopf's HTTPS server, started once the files are there;
- ``webhook``: one replica's admission part, as the controller runs it.
"""
