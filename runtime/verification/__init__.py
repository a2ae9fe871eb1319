"""``etforge verify``: the gates that judge a compile against torch and the device's arithmetic.

``verify`` orchestrates (the one path of the CLI and the API); each gate is its own module
(``artifact``, ``report_fields``, ``float_check``, ``stepwise``, ``simulate``, ``exact_pass``,
``pte_agreement``, ``outputs``, ``accuracy``); ``inputs`` draws the seeded samples,
``reference`` evaluates the quantized reference in float64, ``verify_steps`` times each step,
``script_pte`` verifies a ``.pte`` a user's script wrote. Imports ``runtime.arithmetic`` and
``runtime.execution``, never ``runtime.firmware``.
"""
