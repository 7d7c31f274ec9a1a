"""What is trained: data sets, models, the factories of your own, and what a step costs."""
