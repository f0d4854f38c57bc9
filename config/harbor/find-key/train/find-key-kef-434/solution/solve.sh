#!/bin/sh
ans "$(cat kef)"
