from engine.main import main

main()
