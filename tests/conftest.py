import os
import sys

# Tests import the project's packages and loadtest.harness from the checkout.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
