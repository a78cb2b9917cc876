"""Adapters: sessionlog under the frameworks users already run (`openai_agents`, `langgraph_tools`)."""
