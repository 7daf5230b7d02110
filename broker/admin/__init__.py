"""Operating a running broker: operators' accounts (accounts.py), the ban list (bans.py), the
commands of the admin API (service.py) and ``python -m broker.admin`` (__main__.py, over the
dashboard's HTTP admin API: client.py)."""
