"""placeholder until sizing lands"""


def register(sub):
    pass
