"""Who may use echod's API, and how often: ``principal`` (who a request comes from, and the
refusals), ``tokens`` (the tokens file and the store of accepted tokens, with rotation),
``munge_users`` (a Unix user proven by MUNGE), ``ratelimit`` (per token and address),
``auth`` (the hook in front of every view), ``audit`` (a line per request) and ``tokens_cli``
(``echod token``). Each imports only those before it in that order.
"""
