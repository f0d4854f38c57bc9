#!/bin/sh
# 1 if the agent answered the key file's content as it was given (the verifier's own copy: the agent may have
# rewritten the file), else 0.
if [ "$(cat /logs/agent/answer.txt 2>/dev/null)" = "781" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
